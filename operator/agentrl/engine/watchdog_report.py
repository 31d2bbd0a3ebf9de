"""What the watchdog tells Kubernetes: its state as a pod annotation, and Events on the job.

Called by ``agentrl.engine.watchdog``. The state goes into the annotation
``agentrl.dev/watchdog`` on the watchdog's own pod as JSON (:class:`WatchdogReport`); the
operator reads it when it summarises the engines and lifts ``state: Degraded`` into the job's
Degraded condition (reason ``WatchdogCrashLoop``). Faults, recoveries and a tripped crash-loop
guard are also written as Events on the AgentRLJob, so ``kubectl describe arj NAME`` shows them.

Two implementations of :class:`Reporter`: :class:`LightkubeReporter` (the API server; the pod's
ServiceAccount needs ``patch`` on its pod, ``create`` on events and ``get`` on agentrljobs) and
:class:`FakeReporter` (records calls, for tests). Reporting never stops the watchdog: an API
error is logged and the watchdog carries on restarting engines.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agentrl.api import API_VERSION, GROUP, KIND, PLURAL, VERSION
from agentrl.api.wire import ANNOTATION_WATCHDOG, WatchdogReport

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]

#: Event reasons (stable: alerts match on them).
REASON_FAULT = "EngineFault"
REASON_RECOVERED = "EngineRecovered"
REASON_CRASH_LOOP = "WatchdogCrashLoop"
REASON_CRASH_LOOP_CLEARED = "WatchdogCrashLoopCleared"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reporter(Protocol):
    """Where the watchdog reports to."""

    async def annotate(self, report: WatchdogReport) -> None:
        """Write ``report`` to the watchdog pod's annotation."""
        ...

    async def event(self, event_type: EventType, reason: str, message: str) -> None:
        """Record an Event on the AgentRLJob."""
        ...


@dataclass
class FakeReporter:
    """A :class:`Reporter` that records what it was told (tests, ``agentrl run``)."""

    reports: list[WatchdogReport] = field(default_factory=list)
    events: list[tuple[EventType, str, str]] = field(default_factory=list)

    async def annotate(self, report: WatchdogReport) -> None:
        self.reports.append(report)

    async def event(self, event_type: EventType, reason: str, message: str) -> None:
        self.events.append((event_type, reason, message))


class LoggingReporter:
    """A :class:`Reporter` that only logs (outside a pod, e.g. ``agentrl run``)."""

    async def annotate(self, report: WatchdogReport) -> None:
        log.info("watchdog state: %s", report.to_annotation())

    async def event(self, event_type: EventType, reason: str, message: str) -> None:
        log.log(
            logging.WARNING if event_type == "Warning" else logging.INFO, "%s: %s", reason, message
        )


class LightkubeReporter:
    """A :class:`Reporter` that talks to the API server through lightkube."""

    def __init__(
        self,
        *,
        pod_name: str,
        namespace: str,
        job_name: str,
        job_uid: str | None = None,
        client: Any = None,
    ) -> None:
        """``client``: a ``lightkube.AsyncClient``; None builds one from the in-cluster config
        or the kubeconfig. ``job_uid`` (the operator passes it through the downward env) ties
        Events to the job in ``kubectl describe``; None looks it up once."""
        self.pod_name = pod_name
        self.namespace = namespace
        self.job_name = job_name
        self.job_uid = job_uid
        self._client = client

    def _get_client(self) -> Any:
        if self._client is None:
            from lightkube import AsyncClient

            self._client = AsyncClient()
        return self._client

    async def annotate(self, report: WatchdogReport) -> None:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        patch = {"metadata": {"annotations": {ANNOTATION_WATCHDOG: report.to_annotation()}}}
        try:
            await self._get_client().patch(
                Pod, self.pod_name, patch, namespace=self.namespace, patch_type=PatchType.MERGE
            )
        except Exception:  # reporting must never stop recovery
            log.exception("could not annotate pod %s/%s", self.namespace, self.pod_name)

    async def _job_uid(self) -> str | None:
        if self.job_uid is None:
            from lightkube.generic_resource import create_namespaced_resource

            resource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
            job = await self._get_client().get(resource, self.job_name, namespace=self.namespace)
            self.job_uid = job.metadata.uid
        return self.job_uid

    async def event(self, event_type: EventType, reason: str, message: str) -> None:
        from lightkube.models.core_v1 import EventSource, ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Event

        try:
            now = dt.datetime.now(dt.UTC)
            body = Event(
                metadata=ObjectMeta(generateName=f"{self.job_name}.", namespace=self.namespace),
                involvedObject=ObjectReference(
                    apiVersion=API_VERSION,
                    kind=KIND,
                    name=self.job_name,
                    namespace=self.namespace,
                    uid=await self._job_uid(),
                ),
                type=event_type,
                reason=reason,
                # The API server caps an Event message at 1 KiB.
                message=f"{self.pod_name}: {message}"[:1024],
                source=EventSource(component="agentrl-watchdog"),
                reportingComponent="agentrl.dev/watchdog",
                reportingInstance=self.pod_name,
                firstTimestamp=now,
                lastTimestamp=now,
                count=1,
            )
            await self._get_client().create(body, namespace=self.namespace)
        except Exception:  # reporting must never stop recovery
            log.exception(
                "could not record event %s on %s/%s", reason, self.namespace, self.job_name
            )
