"""Live concurrency on a cluster: follow the figure the operator writes, and tell the scheduler.

The operator writes the sandbox concurrency *in effect* (``spec.sandbox.concurrency`` after
suspension, quotas and provider limits) into the job's ConfigMap ``NAME-config``, key
``runtime.yaml``, fields ``sandbox.concurrency`` and ``rollout.workers``
(:class:`agentrl.api.wire.RuntimeConfig`). ``kubectl scale arj/NAME``, an HPA or the
autoscaler change that ConfigMap and nothing else, so no pod restarts; the rollout tier must
follow it. Two sources read it:

* :class:`RuntimeFileSource` polls the ConfigMap as mounted in the rollout and trainer pods
  (``/etc/agentrl/runtime.yaml``; the kubelet swaps the files atomically, within its sync period
  of up to about a minute). This is what runs in the cluster: the rollout workers' Role grants
  pods only, and a mounted file needs no API access at all.
* :class:`ConfigMapSource` watches the ConfigMap through the API (a kubeconfig, or the in-cluster
  ServiceAccount with ``get``/``watch`` on it): seconds instead of the kubelet's minute, for a
  worker running outside the cluster (tests, a laptop driving a cluster).

:func:`follow` turns either into :meth:`RolloutScheduler.set_concurrency` calls with this
worker's share (:func:`split_concurrency`). ``open_rollout`` starts from the share of the figure
in effect when the source can already tell it (``current()``: the mounted file, or one GET of
the ConfigMap), else from the spec's, until the source's first reading. A figure that
cannot be read leaves the last one in effect: a torn or invalid file must never stop the
rollout tier (0) or unleash it.

Callers: rollout workers (``open_rollout(..., concurrency_source=...)``), ``e2e/test_scaling.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.api.wire import CONFIG_RUNTIME_KEY, RUNTIME_FILE, WireSkewError, receive_runtime

logger = logging.getLogger(__name__)

#: Seconds between two reads of the mounted file: a stat and a small read, cheap enough that the
#: kubelet's own refresh (up to about a minute) stays the only noticeable delay.
FILE_POLL_SECONDS = 2.0
#: First wait before re-opening a broken ConfigMap watch; doubles up to 30 s.
WATCH_RETRY_SECONDS = 1.0
#: How long a worker waits for the ConfigMap's figure before it starts from the spec's share.
CURRENT_READ_SECONDS = 10.0


class InEffect(BaseModel):
    """The part of ``runtime.yaml`` the rollout tier follows."""

    model_config = ConfigDict(frozen=True)

    concurrency: int = Field(ge=0)
    """``sandbox.concurrency``: episodes in flight across all rollout workers."""
    workers: int = Field(default=1, ge=0)
    """``rollout.workers``: rollout workers the concurrency is split over."""


class ConcurrencySource(Protocol):
    """Yields the in-effect figures: the current ones first, then each change."""

    def changes(self) -> AsyncIterator[InEffect]: ...

    async def current(self) -> InEffect | None:
        """The figures in effect now, read once without waiting for a change; None when they
        cannot be read yet (a file not mounted or not valid, an API server not answering)."""
        ...


def parse_runtime(text: str) -> InEffect:
    """The in-effect figures of a ``runtime.yaml`` (:class:`~agentrl.api.wire.RuntimeConfig`,
    what the operator writes), read under the wire contract's skew policy: keys the rollout
    tier does not know (an operator one minor version apart) are logged and ignored.
    ValueError when it is not one; a :class:`~agentrl.api.wire.WireSkewError` (a ValueError
    too, naming both versions) when an operator more than one minor version apart wrote it."""
    try:
        received = receive_runtime(yaml.safe_load(text), reader="this rollout tier")
    except WireSkewError:
        raise
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"runtime.yaml is not the operator's runtime config: {exc}") from exc
    if received.unknown:
        logger.warning(
            "runtime.yaml (wire contract %s) has keys this rollout tier does not know, "
            "ignored: %s",
            received.version,
            ", ".join(received.unknown),
        )
    runtime = received.value
    return InEffect(concurrency=runtime.sandbox.concurrency, workers=runtime.rollout.workers)


def split_concurrency(total: int, workers: int, index: int) -> int:
    """Worker ``index``'s share of ``total``: an even split, the remainder to the first workers,
    so the shares add up to exactly ``total``. A worker beyond ``workers`` gets 0 (the
    Deployment is being scaled down)."""
    if workers <= 0 or index >= workers:
        return 0
    return total // workers + (1 if index < total % workers else 0)


class RuntimeFileSource:
    """Polls the mounted ``runtime.yaml``."""

    def __init__(
        self, path: str | Path = RUNTIME_FILE, *, poll_seconds: float = FILE_POLL_SECONDS
    ) -> None:
        self.path = Path(path)
        self.poll_seconds = poll_seconds

    async def changes(self) -> AsyncIterator[InEffect]:
        last_text: str | None = None
        while True:
            try:
                text = await asyncio.to_thread(self.path.read_text)
            except OSError as exc:
                if last_text is not None:
                    logger.warning("cannot read %s (keeping the last figure): %s", self.path, exc)
                text = None
            if text is not None and text != last_text:
                last_text = text
                try:
                    yield parse_runtime(text)
                except ValueError as exc:
                    logger.warning("%s (keeping the last figure)", exc)
            await asyncio.sleep(self.poll_seconds)

    async def current(self) -> InEffect | None:
        """The mounted file's figures now (None: not mounted or not valid yet)."""
        try:
            return parse_runtime(await asyncio.to_thread(self.path.read_text))
        except (OSError, ValueError):
            return None


def share_of(figures: InEffect, *, worker_index: int = 0, whole: bool = False) -> int:
    """The concurrency one scheduler runs of ``figures``: worker ``worker_index``'s share
    (:func:`split_concurrency`), or ``whole`` the whole figure."""
    if whole:
        return figures.concurrency
    return split_concurrency(figures.concurrency, figures.workers, worker_index)


class ConfigMapSource:
    """Watches ``NAME-config`` through the API server."""

    def __init__(self, namespace: str, name: str, *, kubeconfig: str | None = None) -> None:
        self.namespace = namespace
        self.name = name
        self.kubeconfig = kubeconfig

    def _client(self) -> Any:
        from lightkube import AsyncClient, KubeConfig

        # from_env: the in-cluster ServiceAccount, else $KUBECONFIG / ~/.kube/config
        config = KubeConfig.from_file(self.kubeconfig) if self.kubeconfig else KubeConfig.from_env()
        return AsyncClient(config=config, namespace=self.namespace)

    async def current(self) -> InEffect | None:
        """The ConfigMap's figures now, by one GET (None: not there, not valid, or the API
        server did not answer within :data:`CURRENT_READ_SECONDS`)."""
        from lightkube.resources.core_v1 import ConfigMap

        try:
            client = self._client()
        except Exception as exc:  # no kubeconfig, no ServiceAccount
            logger.warning("cannot read ConfigMap %s/%s: %s", self.namespace, self.name, exc)
            return None
        try:
            async with asyncio.timeout(CURRENT_READ_SECONDS):
                config_map = await client.get(ConfigMap, self.name, namespace=self.namespace)
            text = (config_map.data or {}).get(CONFIG_RUNTIME_KEY)
            return None if text is None else parse_runtime(text)
        except Exception as exc:  # absent, forbidden, unreachable, torn: the spec's share
            logger.warning("cannot read ConfigMap %s/%s: %s", self.namespace, self.name, exc)
            return None
        finally:
            await client.close()

    async def changes(self) -> AsyncIterator[InEffect]:
        from lightkube.resources.core_v1 import ConfigMap

        client = self._client()
        delay = WATCH_RETRY_SECONDS
        try:
            while True:
                try:
                    async for kind, config_map in client.watch(
                        ConfigMap,
                        namespace=self.namespace,
                        fields={"metadata.name": self.name},
                    ):
                        delay = WATCH_RETRY_SECONDS
                        if kind == "DELETED":
                            continue  # the job is going; its pods go with it
                        text = (config_map.data or {}).get(CONFIG_RUNTIME_KEY)
                        if text is None:
                            continue
                        try:
                            yield parse_runtime(text)
                        except ValueError as exc:
                            logger.warning("%s (keeping the last figure)", exc)
                except Exception as exc:  # the API server restarted, a network blip
                    logger.warning(
                        "watch of ConfigMap %s/%s broke (retrying in %.0fs): %s",
                        self.namespace,
                        self.name,
                        delay,
                        exc,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
        finally:
            await client.close()


class ConcurrencyTarget(Protocol):
    """What :func:`follow` drives (:class:`~agentrl.rollout.scheduler.RolloutScheduler`)."""

    def set_concurrency(self, concurrency: int) -> None: ...


async def follow(
    source: ConcurrencySource,
    scheduler: ConcurrencyTarget,
    *,
    worker_index: int = 0,
    whole: bool = False,
) -> None:
    """Apply each in-effect figure's share to ``scheduler``, until cancelled; ``whole``: the
    whole figure (the driver's scheduler when the workers only run what it hands them)."""
    applied: int | None = None
    async for figures in source.changes():
        share = share_of(figures, worker_index=worker_index, whole=whole)
        if share != applied:
            scheduler.set_concurrency(share)
            applied = share


def source_for_worker(
    *,
    runtime_file: str | Path = RUNTIME_FILE,
    namespace: str | None = None,
    config_map: str | None = None,
    kubeconfig: str | None = None,
) -> ConcurrencySource:
    """The mounted file when it exists (in the cluster), else a watch of the ConfigMap named by
    ``namespace``/``config_map`` (a worker outside the cluster)."""
    if Path(runtime_file).exists():
        return RuntimeFileSource(runtime_file)
    if namespace and config_map:
        return ConfigMapSource(namespace, config_map, kubeconfig=kubeconfig)
    raise FileNotFoundError(
        f"{runtime_file} is not mounted and no ConfigMap was named: cannot follow the job's "
        "sandbox concurrency"
    )
