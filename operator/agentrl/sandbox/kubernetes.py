"""The ``kubernetes`` provider: one pod per episode, commands through the pod exec API.

Each sandbox is a pod made from the hardened template the operator renders into the job's
``runtime.yaml`` (:class:`agentrl.api.wire.SandboxPods`, built by
``agentrl.reconcile.sandbox.sandbox_pods``: no ServiceAccount token, seccomp RuntimeDefault, all
capabilities dropped, resources from ``spec.sandbox``, owned by the job,
``activeDeadlineSeconds`` as a last-resort reaper). The provider changes only the pod's name,
the task's image and its own labels, and puts the pod on the shared pod network under the job's
NetworkPolicy (no per-sandbox networks). Commands and files go through
the exec subresource (:mod:`agentrl.sandbox.kube_exec`); the pod is deleted when the episode
ends. Pods carry this worker's id as a label, so a restarted worker deletes what its previous
incarnation left behind (:meth:`KubernetesProvider.reap`), and the job's ownerReference
garbage-collects all of them when the job goes.

Creations are paced by ``spec.sandbox.maxCreatesPerSecond`` (a token bucket) to protect the API
server. The API is reached through a :class:`PodTransport`: :class:`KubeApiTransport` (lightkube
for pods, aiohttp websockets for exec) in production, a fake in unit tests.

Callers: :func:`agentrl.sandbox.open_provider` for ``provider: kubernetes``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any, Protocol

from agentrl.api.wire import SandboxPods
from agentrl.sandbox import kube_exec
from agentrl.sandbox.errors import (
    SandboxCreateError,
    SandboxFileError,
    SandboxGone,
)
from agentrl.sandbox.metrics import SANDBOX_CREATE_RATE_LIMIT
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest, resolve_path
from agentrl.sandbox.ratelimit import TokenBucket

logger = logging.getLogger(__name__)

#: Label naming the rollout worker that created a sandbox pod (for reaping after a crash).
WORKER_LABEL = "agentrl.dev/rollout-worker"
#: Label carrying the episode id (truncated to a valid label value).
EPISODE_LABEL = "agentrl.dev/episode"
CONTAINER = "sandbox"
#: First wait between two reads of a starting pod's phase; it doubles up to ``poll_seconds``.
FIRST_POLL_SECONDS = 0.05
#: Seconds a command may overrun its own timeout before the socket is abandoned.
EXEC_GRACE_SECONDS = 10.0

class PodTransport(Protocol):
    """The Kubernetes API as the provider uses it."""

    namespace: str

    async def create_pod(self, manifest: dict[str, Any]) -> None: ...

    async def pod_phase(self, name: str) -> tuple[str, str]:
        """(phase, reason): ``Pending``/``Running``/``Failed``/... and why, if said."""
        ...

    async def exec(
        self, name: str, argv: list[str], *, timeout: float
    ) -> tuple[bytes, bytes, int]: ...

    async def delete_pod(self, name: str) -> None: ...

    async def delete_pods(self, selector: Mapping[str, str]) -> int:
        """Delete every pod matching the labels; how many there were."""
        ...

    async def close(self) -> None: ...


def _label_value(value: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in value)[:63]
    return cleaned.strip("-_.") or "x"


class KubernetesSandbox(SandboxBase):
    """One sandbox pod."""

    def __init__(self, provider: KubernetesProvider, pod: str, request: SandboxRequest) -> None:
        self._provider = provider
        self.id = pod
        self.workdir = request.workdir
        self._env = dict(request.env)
        self._closed = False

    async def _raw(self, argv: list[str], timeout: float) -> tuple[bytes, bytes, int]:
        if self._closed:
            raise SandboxGone(f"sandbox {self.id} is closed", provider="kubernetes")
        return await self._provider.transport.exec(self.id, argv, timeout=timeout)

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        merged = {**self._env, **(env or {})}
        prefix = "".join(f"export {k}={_sh(v)}; " for k, v in merged.items())
        argv = kube_exec.timed_command(prefix + command, timeout, cwd or self.workdir)
        start = time.monotonic()
        try:
            out, err, code = await asyncio.wait_for(
                self._raw(argv, timeout + EXEC_GRACE_SECONDS), timeout + EXEC_GRACE_SECONDS
            )
        except TimeoutError:
            return ExecResult(exit_code=124, timed_out=True, duration_seconds=timeout)
        return ExecResult(
            exit_code=code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=code == 124,
            duration_seconds=time.monotonic() - start,
        )

    async def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else data
        full = resolve_path(self.workdir, path)
        for argv in kube_exec.write_commands(full, payload):
            _, err, code = await self._raw(argv, self._provider.file_timeout)
            if code != 0:
                raise SandboxFileError(
                    f"cannot write {full}: {err.decode(errors='replace')[-200:]}",
                    provider="kubernetes",
                )

    async def read_file(self, path: str) -> bytes:
        full = resolve_path(self.workdir, path)
        out, err, code = await self._raw(
            ["/bin/sh", "-c", f"test -f {_sh(full)} || exit 44; cat {_sh(full)}"],
            self._provider.file_timeout,
        )
        if code == 44:
            raise FileNotFoundError(full)
        if code != 0:
            raise SandboxFileError(
                f"cannot read {full}: {err.decode(errors='replace')[-200:]}", provider="kubernetes"
            )
        return out

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._provider.delete(self.id)


def _sh(value: str) -> str:
    import shlex

    return shlex.quote(value)


class KubernetesProvider:
    """Creates sandbox pods from the job's template and deletes them after the episode."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        transport: PodTransport,
        pods: SandboxPods,
        worker_id: str,
        creates_per_second: float,
        poll_seconds: float = 1.0,
        file_timeout: float = 60.0,
    ) -> None:
        self.transport = transport
        self.pods = pods
        """The operator's pod template; its selector (the job's sandbox-pod labels) is matched
        by reaping as well as the worker id, so a worker never deletes another job's pods that
        happen to carry the same worker name."""
        self.worker_id = _label_value(worker_id)
        self.poll_seconds = poll_seconds
        self.file_timeout = file_timeout
        self.bucket = TokenBucket(creates_per_second)
        SANDBOX_CREATE_RATE_LIMIT.labels(self.name).set(creates_per_second)
        self._reaping: asyncio.Task[int] | None = None

    def pod_manifest(self, pod: str, request: SandboxRequest) -> dict[str, Any]:
        """The template's pod with this worker's and episode's labels."""
        manifest = self.pods.pod(
            pod,
            request.image,
            {WORKER_LABEL: self.worker_id, EPISODE_LABEL: _label_value(request.episode_id)},
        )
        container = manifest["spec"]["containers"][0]
        if request.workdir:
            container.setdefault("workingDir", request.workdir)
        if request.image is None and request.workdir:
            # Tasks without an image of their own (toy tasks) write their repository in: give
            # them a writable, world-writable emptyDir there, since the pod runs as non-root.
            manifest["spec"].setdefault("volumes", []).append({"name": "workspace", "emptyDir": {}})
            container.setdefault("volumeMounts", []).append(
                {"name": "workspace", "mountPath": request.workdir}
            )
        return manifest

    async def reap(self) -> int:
        """Delete every sandbox pod this worker id owns (left over from a crashed run)."""
        count = await self.transport.delete_pods(
            {**self.pods.selector, WORKER_LABEL: self.worker_id}
        )
        if count:
            logger.warning("reaped %d sandbox pods left by worker %s", count, self.worker_id)
        return count

    async def _reap_once(self) -> int:
        """:meth:`reap`, where a failure only costs the leftovers (their ownerReference and
        ``activeDeadlineSeconds`` still remove them): it must not fail every create after it."""
        try:
            return await self.reap()
        except Exception as exc:
            logger.warning("cannot reap the sandbox pods of worker %s: %s", self.worker_id, exc)
            return 0

    async def create(self, request: SandboxRequest) -> KubernetesSandbox:
        # Every create waits for the one reap of what an earlier incarnation left: a create
        # that went ahead while the reap was listing this worker's pods lost its new pod to it
        # (on the real node, the first episodes of a run failed as sandbox_create infra errors).
        if self._reaping is None:
            self._reaping = asyncio.ensure_future(self._reap_once())
        await asyncio.shield(self._reaping)
        await self.bucket.acquire()
        pod = f"{self.pods.name_prefix}{secrets.token_hex(6)}"
        try:
            try:
                await self.transport.create_pod(self.pod_manifest(pod, request))
            except SandboxCreateError:
                raise
            except Exception as exc:
                raise SandboxCreateError(
                    f"cannot create pod {pod}: {exc}", provider=self.name
                ) from exc
            await self._wait_running(pod)
        except BaseException:
            # Never leave a half-started pod behind. That includes a create whose answer was
            # lost (client timeout, cancellation by the startup deadline) after the API server
            # had stored the pod: an uncounted live pod would break the concurrency invariant,
            # and deleting a pod that was never stored is a harmless 404.
            await self.delete(pod)
            raise
        return KubernetesSandbox(self, pod, request)

    async def _wait_running(self, pod: str) -> None:
        # The episode bounds the whole wait with sandbox.startupTimeoutSeconds. Polls start
        # fast and back off to poll_seconds: most pods start within a second, and a fixed fast
        # poll of every starting pod would load the API server in proportion to concurrency.
        interval = min(FIRST_POLL_SECONDS, self.poll_seconds)
        while True:
            try:
                phase, reason = await self.transport.pod_phase(pod)
            except Exception as exc:
                raise SandboxCreateError(f"pod {pod}: {exc}", provider=self.name) from exc
            if phase == "Running":
                return
            if phase in ("Failed", "Succeeded", "Gone"):
                raise SandboxCreateError(
                    f"pod {pod} ended before use: {phase} {reason}".strip(), provider=self.name
                )
            await asyncio.sleep(interval)
            interval = min(interval * 2, self.poll_seconds)

    async def delete(self, pod: str) -> None:
        try:
            await self.transport.delete_pod(pod)
        except Exception as exc:  # the ownerReference and activeDeadline still clean up
            logger.warning("cannot delete sandbox pod %s: %s", pod, exc)

    async def aclose(self) -> None:
        await self.transport.close()


class KubeApiTransport:
    """:class:`PodTransport` over a real API server: lightkube for pods, aiohttp for exec."""

    def __init__(self, namespace: str, *, kubeconfig: str | None = None) -> None:
        from lightkube import AsyncClient, KubeConfig
        from lightkube.config.client_adapter import verify_cluster
        from lightkube.config.models import User

        config = (KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()).get()
        assert config is not None
        self.namespace = namespace
        self._client = AsyncClient(config=config, namespace=namespace, field_manager="agentrl")
        self._server = config.cluster.server
        self._ssl = (
            verify_cluster(config.cluster, config.user or User(), config.abs_file)
            if self._server.startswith("https")
            else None
        )
        token = config.user.token if config.user is not None else None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: Any = None

    def _ws_session(self) -> Any:
        import aiohttp

        if self._session is None:
            # limit=0: exec sockets are bounded by the episodes in flight, not by a pool.
            connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl if self._ssl else False)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def create_pod(self, manifest: dict[str, Any]) -> None:
        from lightkube.resources.core_v1 import Pod

        pod: Pod = Pod.from_dict(manifest)  # type: ignore[assignment]
        await self._client.create(pod)

    async def pod_phase(self, name: str) -> tuple[str, str]:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            pod = await self._client.get(Pod, name)
        except ApiError as exc:
            if exc.status.code == 404:
                return "Gone", "deleted"
            raise
        status = pod.status
        if status is None:
            return "Pending", ""
        reason = status.reason or ""
        for cs in status.containerStatuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in (
                "ErrImagePull",
                "ImagePullBackOff",
                "InvalidImageName",
            ):
                return "Failed", f"{waiting.reason}: {waiting.message or ''}"
        return status.phase or "Pending", reason

    async def exec(self, name: str, argv: list[str], *, timeout: float) -> tuple[bytes, bytes, int]:
        url = kube_exec.exec_url(self._server, self.namespace, name, argv, CONTAINER)
        return await kube_exec.run_exec(
            self._ws_session(), url, headers=self._headers, timeout=timeout
        )

    async def delete_pod(self, name: str) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            await self._client.delete(Pod, name, grace_period=0)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def delete_pods(self, selector: Mapping[str, str]) -> int:
        from lightkube.resources.core_v1 import Pod

        names = [
            pod.metadata.name
            async for pod in self._client.list(Pod, labels=dict(selector))
            if pod.metadata is not None and pod.metadata.name
        ]
        for name in names:
            await self.delete_pod(name)
        return len(names)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self._client.close()
