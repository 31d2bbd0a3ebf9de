"""kopf wiring: the AgentRLJob watch feeds the work queue; startup starts the workers, the
child watches, the resync loop and the metrics endpoint; cleanup stops them.

Only ``on.event``, ``on.startup``, ``on.cleanup`` and ``on.probe`` handlers are registered: kopf
adds finalizers only for deletion handlers, daemons and timers, so none is ever put on a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from prometheus_client import start_http_server

from agentrl.api import job as job_api
from agentrl.controller import metrics
from agentrl.controller.kube import LightkubeAPI
from agentrl.controller.reconciler import Reconciler
from agentrl.controller.settings import OperatorSettings
from agentrl.controller.watches import WATCHED, watch_children
from agentrl.controller.workqueue import Key, WorkQueue
from agentrl.reconcile.constants import FIELD_MANAGER

log = logging.getLogger("agentrl.operator")


class OperatorRuntime:
    """The queue, the reconciler and the background tasks of one operator process."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.queue = WorkQueue()
        self.client: AsyncClient | None = None
        self.reconciler: Reconciler | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.failures: dict[Key, int] = {}

    async def start(self) -> None:
        self.client = AsyncClient(field_manager=FIELD_MANAGER)
        self.reconciler = Reconciler(LightkubeAPI(self.client), self.settings)
        metrics.WORKERS.set(self.settings.workers)
        if self.settings.metrics_port:
            start_http_server(self.settings.metrics_port)
        for i in range(self.settings.workers):
            self.tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-{i}"))
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        for resource in WATCHED:
            for ns in scopes:
                self.tasks.append(
                    asyncio.create_task(
                        watch_children(self.client, resource, ns, self._child_event),
                        name=f"watch-{resource.__name__}-{ns or 'all'}",
                    )
                )
        self.tasks.append(asyncio.create_task(self._resync(), name="resync"))

    async def stop(self) -> None:
        self.queue.close()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        if self.client is not None:
            await self.client.close()

    def enqueue(self, key: Key, *, after: float = 0.0) -> None:
        self.queue.add(key, after=after)
        metrics.QUEUE_DEPTH.set(len(self.queue))

    def _child_event(self, event_type: str, key: Key) -> None:
        if event_type == "DELETED" and self.reconciler is not None:
            self.reconciler.forget_applied(key)  # re-create what was deleted behind our back
        self.enqueue(key)

    async def _resync(self) -> None:
        assert self.reconciler is not None
        api = self.reconciler.api
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            scopes: list[str | None] = list(self.settings.namespaces) or [None]
            for ns in scopes:
                try:
                    jobs = await api.list_jobs(ns)
                except Exception as exc:
                    log.warning("resync list failed: %s", exc)
                    continue
                for body in jobs:
                    key = Key(body["metadata"]["namespace"], body["metadata"]["name"])
                    self.reconciler.forget_applied(key)
                    self.enqueue(key)

    async def _worker(self) -> None:
        assert self.reconciler is not None
        while True:
            key = await self.queue.get()
            if key is None:
                return
            metrics.QUEUE_DEPTH.set(len(self.queue))
            try:
                after = await self.reconciler.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                n = self.failures.get(key, 0) + 1
                self.failures[key] = n
                delay = min(
                    self.settings.retry_base_seconds * 2 ** (n - 1), self.settings.retry_max_seconds
                )
                kind = _error_kind(exc)
                metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
                metrics.RECONCILES.labels(result="error").inc()
                log.warning(
                    "reconcile of %s failed (attempt %d, retry in %.1fs): %s",
                    key,
                    n,
                    delay,
                    exc,
                    exc_info=kind == "unexpected",
                )
                self.reconciler.forget_applied(key)
                self.queue.done(key)
                self.enqueue(key, after=delay)
                continue
            self.failures.pop(key, None)
            self.queue.done(key)
            if after is not None:
                self.enqueue(key, after=max(after, 0.5))


def _error_kind(exc: Exception) -> str:
    """``conflict`` (409: someone else wrote first; the retry re-reads), ``api`` (any other
    answer of the API server), ``unexpected`` (a bug: logged with its traceback)."""
    if isinstance(exc, ApiError):
        return "conflict" if exc.status.code == 409 else "api"
    return "unexpected"


def register(settings: OperatorSettings) -> tuple[kopf.OperatorRegistry, OperatorRuntime]:
    """A kopf registry with the operator's handlers, and the runtime they drive."""
    registry = kopf.OperatorRegistry()
    runtime = OperatorRuntime(settings)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # in a pod: the mounted service-account token; elsewhere: $KUBECONFIG / ~/.kube/config
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING  # kopf's own events: problems only
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        await runtime.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    @kopf.on.event(job_api.GROUP, job_api.VERSION, job_api.PLURAL, registry=registry)
    def job_event(namespace: str, name: str, **_: Any) -> None:
        runtime.enqueue(Key(namespace, name))

    @kopf.on.probe(id="queueDepth", registry=registry)
    def queue_depth(**_: Any) -> int:
        return len(runtime.queue)

    return registry, runtime
