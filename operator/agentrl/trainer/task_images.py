"""The dataset's task images, handed to the operator's pre-pull: the driver (rank 0) writes them
into the ``NAME-task-images`` ConfigMap once it has loaded the dataset, and the operator pulls
them onto the sandbox nodes (:mod:`agentrl.reconcile.prepull`).

The operator names that ConfigMap in ``AGENTRL_TASK_IMAGES_CONFIGMAP`` only when pre-pull is on
(``spec.sandbox.prePull.enabled`` with pod sandboxes); its trainer Role may ``get`` and
``patch`` that one ConfigMap. The images go in the order the driver draws their tasks, so the
first to be needed are pulled first; each once.

A ConfigMap holds at most 1 MiB (the API server's limit, not ours): a list longer than
:data:`MAX_BYTES` keeps the images drawn first, and the rest are counted in the log and in the
returned figure (they are pulled by the sandboxes themselves, as without pre-pull).

:class:`LightkubeTaskImagesSink` merge-patches the ConfigMap; :class:`FakeTaskImagesSink`
records (tests). Publishing never stops training: an API error is logged.

Callers: :func:`agentrl.trainer.pod.drive`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.api.wire import TASK_IMAGES_KEY

log = logging.getLogger(__name__)

#: Bytes of the image list at most: a ConfigMap's 1 MiB less room for its metadata.
MAX_BYTES = 1_000_000


class TaskImagesSink(Protocol):
    """Where the driver writes the dataset's images."""

    async def publish(self, listing: str) -> None: ...


@dataclass
class FakeTaskImagesSink:
    """Records what was published (tests)."""

    published: list[str] = field(default_factory=list)

    async def publish(self, listing: str) -> None:
        self.published.append(listing)


class LightkubeTaskImagesSink:
    """Merge-patches ``data.images`` of the named ConfigMap (which the operator created)."""

    def __init__(self, *, name: str, namespace: str, client: Any = None) -> None:
        """``client``: a ``lightkube.AsyncClient``; None builds one from the in-cluster config."""
        self.name = name
        self.namespace = namespace
        self._client = client

    async def publish(self, listing: str) -> None:
        from lightkube.resources.core_v1 import ConfigMap
        from lightkube.types import PatchType

        if self._client is None:
            from lightkube import AsyncClient

            self._client = AsyncClient()
        await self._client.patch(
            ConfigMap,
            self.name,
            {"data": {TASK_IMAGES_KEY: listing}},
            namespace=self.namespace,
            patch_type=PatchType.MERGE,
        )


def listing(images: Sequence[str], *, max_bytes: int = MAX_BYTES) -> tuple[str, int]:
    """The ConfigMap value for ``images`` (distinct, in order, one per line) and how many did
    not fit in ``max_bytes``."""
    distinct = list(dict.fromkeys(i for i in images if i))
    kept: list[str] = []
    size = 0
    for image in distinct:
        size += len(image.encode()) + 1
        if size > max_bytes:
            break
        kept.append(image)
    return "".join(f"{image}\n" for image in kept), len(distinct) - len(kept)


async def publish(sink: TaskImagesSink, images: Sequence[str]) -> int:
    """Write ``images`` to ``sink``; returns how many were left out (see :data:`MAX_BYTES`).
    Errors are logged, never raised."""
    value, left_out = listing(images)
    if left_out:
        log.warning(
            "%d task images do not fit in one ConfigMap (1 MiB) and are not pre-pulled; the "
            "sandboxes pull them when their tasks come up",
            left_out,
        )
    try:
        await sink.publish(value)
    except Exception:  # pre-pull is an optimisation: never stop training for it
        log.exception("could not write the task images for pre-pull")
    else:
        log.info("%d task images written for pre-pull", value.count("\n"))
    return left_out


def sink_for(env: Any) -> TaskImagesSink | None:
    """The ConfigMap the operator named, inside a pod; None when pre-pull is off or outside a
    pod."""
    if env.task_images_configmap and env.namespace:
        return LightkubeTaskImagesSink(name=env.task_images_configmap, namespace=env.namespace)
    return None


def images_in_draw_order(
    order: Any, *, cursor: int, pending: Sequence[int], held_out: Sequence[Any] = ()
) -> list[str]:
    """The task images in the order the driver will need them: the positions a resumed run
    replays, one epoch of :class:`~agentrl.trainer.loop.TaskOrder` from ``cursor``, then the
    held-out tasks' (evaluated later). Each image once."""
    positions = [*pending, *range(cursor, cursor + len(order.tasks))]
    tasks = [*(order[p] for p in positions), *held_out]
    return list(dict.fromkeys(t.image for t in tasks if t.image))
