"""Sandboxes: one small async interface, providers chosen by ``spec.sandbox.provider``.

``local`` (Linux namespaces on this machine), ``kubernetes`` (a pod per episode), ``e2b`` (cloud
microVMs) and ``fake`` (in memory, for tests). :func:`open_provider` builds one from the spec and
wraps it in the metrics recorder; provider modules are imported only when chosen.

Callers: rollout workers, ``agentrl run``, ``agentrl tasks validate``.
"""

from __future__ import annotations

from agentrl.api.quantities import parse_quantity
from agentrl.api.sandbox import SandboxProvider as ProviderName
from agentrl.api.sandbox import SandboxSpec
from agentrl.api.wire import SandboxPods
from agentrl.sandbox.errors import (
    SandboxCreateError,
    SandboxError,
    SandboxExecError,
    SandboxFileError,
    SandboxGone,
    SandboxRateLimited,
)
from agentrl.sandbox.metrics import InstrumentedProvider
from agentrl.sandbox.provider import ExecResult, Sandbox, SandboxProvider, SandboxRequest

__all__ = [
    "ExecResult",
    "InstrumentedProvider",
    "Sandbox",
    "SandboxCreateError",
    "SandboxError",
    "SandboxExecError",
    "SandboxFileError",
    "SandboxGone",
    "SandboxProvider",
    "SandboxRateLimited",
    "SandboxRequest",
    "open_provider",
]


def open_provider(
    spec: SandboxSpec,
    *,
    pods: SandboxPods | None = None,
    namespace: str | None = None,
    worker_id: str = "local",
    kubeconfig: str | None = None,
    local_base_dir: str | None = None,
) -> InstrumentedProvider:
    """The provider ``spec.provider`` names, configured from the spec and instrumented.

    ``kubernetes`` needs ``pods``, the sandbox pod template the operator wrote into the job's
    ``runtime.yaml`` (``sandbox.pods``), and creates its pods in ``namespace`` (default: the
    template's); ``worker_id`` is the rollout worker's stable name (its pod name), used to reap
    pods after a crash;
    ``local_base_dir`` is where ``local`` sandboxes make their directories.
    """
    provider: SandboxProvider
    if spec.provider == ProviderName.LOCAL:
        from agentrl.sandbox.local import LocalProvider

        provider = LocalProvider(
            base_dir=local_base_dir,
            memory_bytes=int(parse_quantity(spec.memory)),
            max_file_bytes=int(parse_quantity(spec.ephemeral_storage)),
        )
    elif spec.provider == ProviderName.E2B:
        from agentrl.sandbox.e2b import E2BProvider

        if spec.e2b is None:
            raise ValueError("spec.sandbox.e2b is required for provider e2b")
        provider = E2BProvider(
            template=spec.e2b.template,
            max_concurrent=spec.e2b.max_concurrent,
            max_creates_per_second=spec.e2b.max_creates_per_second,
            sandbox_timeout_seconds=spec.e2b.timeout_seconds,
            domain=spec.e2b.domain,
        )
    else:
        from agentrl.sandbox.kubernetes import KubeApiTransport, KubernetesProvider

        if pods is None:
            raise ValueError(
                "provider kubernetes needs the sandbox pod template of the job's runtime.yaml "
                "(sandbox.pods), which the operator writes"
            )
        ns = namespace or pods.template["metadata"].get("namespace") or "default"
        provider = KubernetesProvider(
            transport=KubeApiTransport(ns, kubeconfig=kubeconfig),
            pods=pods,
            worker_id=worker_id,
            creates_per_second=spec.max_creates_per_second,
        )
    return InstrumentedProvider(provider)
