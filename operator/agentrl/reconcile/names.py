"""Names of a job's children, derived from the job name in one place.

Every builder, the controller and the sandbox provider take names from here. At import this
module checks that ``agentrl.api.job.MAX_NAME_LENGTH`` keeps every derived name, and every
label value Kubernetes derives from one (the StatefulSet's ``controller-revision-hash``, the
StatefulSet pod name, an Indexed Job pod's hostname), a valid 63-character DNS label: the API
caps the job name, and this module is where that cap is proven sufficient.
"""

from __future__ import annotations

from typing import Final

from agentrl.api.job import MAX_NAME_LENGTH
from agentrl.api.wire import config_map_name

#: Longest DNS label (RFC 1123) and label value.
DNS_LABEL_MAX: Final = 63
#: Characters of the hash Kubernetes appends to a StatefulSet name in the
#: ``controller-revision-hash`` label (a 32-bit FNV hash, safe-encoded: at most 10).
REVISION_HASH_CHARS: Final = 10
#: Random characters in a sandbox pod name (``NAME-sbx-<12>``), chosen by the provider.
SANDBOX_RANDOM_CHARS: Final = 12
#: Most engines (``spec.inference.engines`` ≤ 1024, so ordinals have at most 4 digits).
MAX_ORDINAL_DIGITS: Final = 4


def engine(job: str) -> str:
    """``NAME-engine``: the engine StatefulSet, its headless Service, PDB and RBAC."""
    return f"{job}-engine"


def engine_pod(job: str, ordinal: int) -> str:
    """``NAME-engine-<ordinal>``: an engine pod (StatefulSet naming)."""
    return f"{engine(job)}-{ordinal}"


def trainer(job: str) -> str:
    """``NAME-trainer``: the trainer Indexed Job and its headless Service."""
    return f"{job}-trainer"


def trainer_hostname(job: str, index: int) -> str:
    """``NAME-trainer-<index>``: an Indexed Job pod's hostname (subdomain ``NAME-trainer``)."""
    return f"{trainer(job)}-{index}"


def rollout(job: str) -> str:
    """``NAME-rollout``: the rollout Deployment, its ServiceAccount, Role and RoleBinding."""
    return f"{job}-rollout"


def sandbox_policy(job: str) -> str:
    """``NAME-sandbox``: the sandbox NetworkPolicy."""
    return f"{job}-sandbox"


def sandbox_pod_prefix(job: str) -> str:
    """``NAME-sbx-``: the prefix of sandbox pod names (the provider appends random chars)."""
    return f"{job}-sbx-"


def prepull(job: str, chunk: int) -> str:
    """``NAME-prepull-<chunk>``: a pre-pull DaemonSet (one per chunk of images)."""
    return f"{job}-prepull-{chunk}"


def task_images(job: str) -> str:
    """``NAME-task-images``: the ConfigMap the trainer writes the dataset's task images into
    (read back by the operator for the pre-pull DaemonSets)."""
    return f"{job}-task-images"


def ray_token(job: str) -> str:
    """``NAME-ray-token``: the Secret with the job's Ray authentication token."""
    return f"{job}-ray-token"


def checkpoints(job: str) -> str:
    """``NAME-checkpoints``: the checkpoint PVC made when the spec names no volume."""
    return f"{job}-checkpoints"


def _longest_derived_values(name: str) -> dict[str, str]:
    """Every value derived from a job ``name`` that must stay a DNS label."""
    return {
        "ConfigMap": config_map_name(name),
        "engine StatefulSet/Service": engine(name),
        "engine pod (statefulset.kubernetes.io/pod-name)": engine_pod(
            name, 10**MAX_ORDINAL_DIGITS - 1
        ),
        "engine controller-revision-hash label": f"{engine(name)}-{'x' * REVISION_HASH_CHARS}",
        "trainer Job/Service": trainer(name),
        "trainer pod hostname": trainer_hostname(name, 10**MAX_ORDINAL_DIGITS - 1),
        "rollout Deployment": rollout(name),
        "sandbox NetworkPolicy": sandbox_policy(name),
        "sandbox pod": sandbox_pod_prefix(name) + "x" * SANDBOX_RANDOM_CHARS,
        "checkpoint PVC": checkpoints(name),
        "task images ConfigMap": task_images(name),
        "Ray token Secret": ray_token(name),
        # a DaemonSet's pods append "-" and 5 random characters
        "pre-pull pod": prepull(name, 10**MAX_ORDINAL_DIGITS - 1) + "-xxxxx",
    }


def _check_name_budget() -> None:
    """Fail at import if MAX_NAME_LENGTH lets any derived value exceed a DNS label."""
    too_long = {
        what: len(value)
        for what, value in _longest_derived_values("n" * MAX_NAME_LENGTH).items()
        if len(value) > DNS_LABEL_MAX
    }
    if too_long:
        raise AssertionError(
            f"agentrl.api.job.MAX_NAME_LENGTH={MAX_NAME_LENGTH} lets these derived names exceed "
            f"{DNS_LABEL_MAX} characters: {too_long}; lower it or shorten the suffixes"
        )


_check_name_budget()
