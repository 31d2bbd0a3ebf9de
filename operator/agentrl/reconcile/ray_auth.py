"""Ray token authentication between a job's pods: the Secret ``NAME-ray-token`` and the
environment that makes every Ray process of the job use it.

Ray (2.52 and later) authenticates its control plane with one static token when
``RAY_AUTH_MODE=token``; it reads the token from ``RAY_AUTH_TOKEN``. Recent releases turn token
authentication on by default, and a worker whose token differs from the head's cannot join. So
every Ray process of a job — the head and the driver on trainer pod 0, the trainer's other
ranks, the rollout worker pods that join the head — gets the same token, from one Secret per
job, and nothing outside the job knows it.

The token is random, so it cannot come from a pure builder that must give the same objects on
every reconcile: the controller creates the Secret once (a ``create``; an existing one is left
alone, so the token never changes under running pods) with :func:`ray_token_secret` and a
token it draws; the Secret is owned by the job and goes with it. The pods only reference it
(:func:`ray_auth_env`); the token never appears in a pod spec or the ConfigMap.

Called by ``trainer`` and ``rollout`` (the env) and by the controller (the Secret).
"""

from __future__ import annotations

from typing import Any, Final

from agentrl.api import AgentRLJob
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.meta import object_meta

#: The Secret's key holding the token.
TOKEN_KEY: Final = "auth_token"
#: Ray's switch and the variable it reads the token from.
RAY_AUTH_MODE_ENV: Final = "RAY_AUTH_MODE"
RAY_AUTH_TOKEN_ENV: Final = "RAY_AUTH_TOKEN"


def ray_token_secret(job: AgentRLJob, ctx: BuildContext, token: str) -> dict[str, Any]:
    """The Secret ``NAME-ray-token`` holding ``token``, owned by the job."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(
            job, ctx, name=names.ray_token(job.metadata.name), component=Component.TRAINER
        ),
        "stringData": {TOKEN_KEY: token},
    }


def ray_auth_env(job: AgentRLJob) -> list[dict[str, Any]]:
    """``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the job's Secret."""
    return [
        {"name": RAY_AUTH_MODE_ENV, "value": "token"},
        {
            "name": RAY_AUTH_TOKEN_ENV,
            "valueFrom": {
                "secretKeyRef": {"name": names.ray_token(job.metadata.name), "key": TOKEN_KEY}
            },
        },
    ]
