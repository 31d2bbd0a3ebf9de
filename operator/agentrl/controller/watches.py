"""Watches of the job's children (StatefulSets, Jobs, Deployments, Pods labelled
``agentrl.dev/job``), selected on the server by label, each event enqueuing the owner job.

kopf watches the AgentRLJobs themselves; children are watched here because kopf filters labels
on the client, which would stream every pod of a large cluster through the operator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient, operators
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

from agentrl.controller import metrics
from agentrl.controller.workqueue import Key
from agentrl.reconcile.constants import LABEL_JOB

log = logging.getLogger("agentrl.operator.watches")

WATCHED = (StatefulSet, Job, Deployment, Pod)


async def watch_children(
    client: AsyncClient,
    resource: Any,
    namespace: str | None,
    on_event: Callable[[str, Key], None],
    *,
    backoff_max: float = 30.0,
) -> None:
    """Watch ``resource`` (all namespaces when ``namespace`` is None) forever, reconnecting
    with backoff; calls ``on_event(event_type, owner_key)`` per event."""
    delay = 1.0
    kind = resource.__name__
    while True:
        try:
            metrics.API_REQUESTS.labels(verb="watch", kind=kind).inc()
            async for event_type, obj in client.watch(
                resource,
                namespace=namespace if namespace is not None else "*",
                labels={LABEL_JOB: operators.exists()},
            ):
                delay = 1.0
                meta = obj.metadata
                job = (meta.labels or {}).get(LABEL_JOB) if meta else None
                if job and meta and meta.namespace:
                    on_event(event_type, Key(meta.namespace, job))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the watch dropped: log, back off, watch again
            log.warning("watch of %s failed (%s); retrying in %.0fs", kind, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, backoff_max)
