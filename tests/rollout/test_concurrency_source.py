"""Following the in-effect concurrency the operator writes: the mounted ``runtime.yaml`` (polled),
the ConfigMap through a real API server (watched), and this worker's share of the figure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api.wire import CONFIG_RUNTIME_KEY
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from agentrl.rollout.concurrency_source import (
    ConfigMapSource,
    InEffect,
    RuntimeFileSource,
    follow,
    parse_runtime,
    source_for_worker,
    split_concurrency,
)
from agentrl.rollout.scheduler import RolloutScheduler


def runtime_yaml(concurrency: int, workers: int = 1) -> str:
    """``runtime.yaml`` as the operator writes it (its own ConfigMap builder), for a job whose
    spec asks for 64 with ``concurrency`` in effect over ``workers`` rollout workers."""
    from agentrl.reconcile.configmap import config_map
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.policies.suspend import WorkloadScale
    from tests.factories import make_job

    job = make_job("swe").with_concurrency(64).obj()
    scale = WorkloadScale(
        engines=1,
        rollout_workers=workers,
        sandbox_concurrency=concurrency,
        concurrency_limited_by=None if concurrency == 64 else "a ResourceQuota",
        trainer_suspended=False,
    )
    data = config_map(job, BuildContext.for_job(job, uid="0000"), scale)["data"]
    return str(data[CONFIG_RUNTIME_KEY])


def write_like_the_kubelet(path: Path, text: str) -> None:
    """The kubelet swaps a ConfigMap volume's files atomically (a rename), never in place."""
    staged = path.with_suffix(".tmp")
    staged.write_text(text)
    os.replace(staged, path)


class Recorder:
    """Records set_concurrency calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def set_concurrency(self, concurrency: int) -> None:
        self.calls.append(concurrency)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def following(coroutine: object) -> AsyncIterator[None]:
    task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_shares_of_all_workers_add_up_to_the_figure_in_effect() -> None:
    # 10 over 3 workers: 3 each and the remainder 1 to worker 0 → 4 + 3 + 3 = 10
    assert [split_concurrency(10, 3, i) for i in range(3)] == [4, 3, 3]
    # a worker the Deployment is scaling away gets nothing, as do all when there are none
    assert split_concurrency(10, 3, 3) == 0
    assert split_concurrency(10, 0, 0) == 0


def test_runtime_yaml_gives_the_concurrency_and_the_workers() -> None:
    assert parse_runtime(runtime_yaml(12, workers=2)) == InEffect(concurrency=12, workers=2)
    # a torn or foreign file is not the operator's runtime config
    with pytest.raises(ValueError, match="not the operator's runtime config"):
        parse_runtime("sandbox: {provider: kubernetes}\n")
    bad = yaml.safe_load(runtime_yaml(12))
    bad["sandbox"]["concurrency"] = -1
    with pytest.raises(ValueError, match=r"sandbox\.concurrency"):
        parse_runtime(yaml.safe_dump(bad))


async def test_the_scheduler_follows_the_mounted_file_when_the_operator_changes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runtime.yaml"
    write_like_the_kubelet(path, runtime_yaml(12))
    scheduler = RolloutScheduler(runner=None, tasks=[], concurrency=3)  # type: ignore[arg-type]
    async with following(follow(RuntimeFileSource(path, poll_seconds=0.01), scheduler)):
        await until(lambda: scheduler.concurrency == 12)
        write_like_the_kubelet(path, runtime_yaml(40))  # kubectl scale up
        await until(lambda: scheduler.concurrency == 40)
        write_like_the_kubelet(path, runtime_yaml(0))  # suspended
        await until(lambda: scheduler.concurrency == 0)


async def test_each_change_is_applied_once_as_this_workers_share(tmp_path: Path) -> None:
    path = tmp_path / "runtime.yaml"
    write_like_the_kubelet(path, runtime_yaml(10, workers=3))
    recorder = Recorder()
    async with following(
        follow(RuntimeFileSource(path, poll_seconds=0.01), recorder, worker_index=1)
    ):
        await until(lambda: recorder.calls == [3])  # 10 over 3: worker 1 runs 3
        # a change elsewhere in the file that leaves this worker's share alone: no call
        write_like_the_kubelet(path, runtime_yaml(11, workers=3))  # shares 4, 4, 3
        await asyncio.sleep(0.1)
        write_like_the_kubelet(path, runtime_yaml(12, workers=2))  # shares 6, 6
        await until(lambda: recorder.calls == [3, 4, 6])
        await asyncio.sleep(0.1)  # ten more polls of an unchanged file
    assert recorder.calls == [3, 4, 6]


async def test_an_unreadable_or_invalid_file_keeps_the_last_figure(tmp_path: Path) -> None:
    path = tmp_path / "runtime.yaml"
    write_like_the_kubelet(path, runtime_yaml(16))
    recorder = Recorder()
    async with following(follow(RuntimeFileSource(path, poll_seconds=0.01), recorder)):
        await until(lambda: recorder.calls == [16])
        write_like_the_kubelet(path, "sandbox: [not, a, mapping]\n")
        await asyncio.sleep(0.1)
        path.unlink()  # the volume is being remounted
        await asyncio.sleep(0.1)
        assert recorder.calls == [16]
        write_like_the_kubelet(path, runtime_yaml(8))
        await until(lambda: recorder.calls == [16, 8])


def test_a_worker_in_the_cluster_reads_the_mounted_file_and_one_outside_watches_the_api(
    tmp_path: Path,
) -> None:
    mounted = tmp_path / "runtime.yaml"
    mounted.write_text(runtime_yaml(1))
    assert isinstance(source_for_worker(runtime_file=mounted), RuntimeFileSource)
    outside = source_for_worker(
        runtime_file=tmp_path / "absent.yaml", namespace="ns", config_map="swe-config"
    )
    assert isinstance(outside, ConfigMapSource)
    assert (outside.namespace, outside.name) == ("ns", "swe-config")
    with pytest.raises(FileNotFoundError, match="cannot follow"):
        source_for_worker(runtime_file=tmp_path / "absent.yaml")


@pytest.mark.apiserver
async def test_the_scheduler_follows_the_configmap_watched_through_the_api_server(
    cluster: ClusterHandle, kubectl: Kubectl
) -> None:
    def put(concurrency: int) -> None:
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "swe-config"},
                "data": {"runtime.yaml": runtime_yaml(concurrency, workers=2)},
            }
        )

    put(9)
    source = ConfigMapSource(
        kubectl.namespace or "default", "swe-config", kubeconfig=str(cluster.kubeconfig)
    )
    scheduler = RolloutScheduler(runner=None, tasks=[], concurrency=0)  # type: ignore[arg-type]
    async with following(follow(source, scheduler, worker_index=0)):
        await until(lambda: scheduler.concurrency == 5)  # 9 over 2 workers: 5 and 4
        await asyncio.to_thread(put, 30)
        await until(lambda: scheduler.concurrency == 15)
        await asyncio.to_thread(
            kubectl.run,
            "patch",
            "configmap",
            "swe-config",
            "--type=merge",
            "-p",
            json.dumps({"data": {"runtime.yaml": runtime_yaml(2, workers=2)}}),
        )
        await until(lambda: scheduler.concurrency == 1)


def _worker_1_of_2(source: RuntimeFileSource) -> contextlib.AbstractAsyncContextManager[Any]:
    """``open_rollout`` of the second of two rollout workers of a job whose spec asks for a
    sandbox concurrency of 6 (a share of 3 each), with no task, following ``source``."""
    from agentrl.rollout.agent import WordTurnTokenizer
    from agentrl.rollout.runtime import open_rollout
    from agentrl.sandbox.fake import FakeProvider
    from tests.factories import make_job

    job = make_job("swe", None).with_model_path("tiny").with_concurrency(6).obj()
    return open_rollout(
        job.spec,
        provider=FakeProvider(),
        engine_urls=["http://127.0.0.1:9"],  # never called: there are no tasks
        tasks=[],
        workers=2,
        worker_index=1,
        tokenizer=WordTurnTokenizer(),
        concurrency_source=source,
    )


async def test_open_rollout_starts_from_the_spec_share_then_follows_the_source(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runtime.yaml"
    source = RuntimeFileSource(path, poll_seconds=0.01)  # not mounted yet
    async with _worker_1_of_2(source) as scheduler:
        assert scheduler.concurrency == 3  # the spec's 6 over 2 workers
        write_like_the_kubelet(path, runtime_yaml(10, workers=2))
        await until(lambda: scheduler.concurrency == 5)  # 10 over 2 workers


async def test_a_scheduler_starts_from_the_figure_in_effect_when_the_file_already_holds_one(
    tmp_path: Path,
) -> None:
    from agentrl.rollout.runtime import starting_concurrency

    path = tmp_path / "runtime.yaml"
    # not mounted yet: the spec's share until the first reading
    assert await starting_concurrency(3, RuntimeFileSource(path)) == 3
    assert await starting_concurrency(3, None) == 3
    path.write_text("not: [yaml")
    assert await starting_concurrency(3, RuntimeFileSource(path)) == 3
    # a quota holds the job at 3 of 6 over 2 workers: worker 1 starts at 1, not the spec's 3
    path.write_text(runtime_yaml(3, workers=2))
    assert await starting_concurrency(3, RuntimeFileSource(path), worker_index=1) == 1
    assert await starting_concurrency(3, RuntimeFileSource(path), worker_index=0) == 2
    assert await starting_concurrency(6, RuntimeFileSource(path), whole=True) == 3


async def test_a_configmap_source_that_cannot_be_read_starts_from_the_spec_share(
    tmp_path: Path,
) -> None:
    from agentrl.rollout.runtime import starting_concurrency

    # a kubeconfig pointing at nothing: the GET fails, the spec's share until the watch answers
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    source = ConfigMapSource("ns", "swe-config", kubeconfig=str(kubeconfig))
    assert await source.current() is None
    assert await starting_concurrency(3, source) == 3


@pytest.mark.apiserver
async def test_a_worker_watching_the_configmap_starts_from_the_figure_in_effect(
    cluster: ClusterHandle, kubectl: Kubectl
) -> None:
    from agentrl.rollout.runtime import starting_concurrency

    # a quota holds the job at 3 of 6 over 2 workers, as the operator wrote it
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "swe-start-config"},
            "data": {"runtime.yaml": runtime_yaml(3, workers=2)},
        }
    )
    source = ConfigMapSource(
        kubectl.namespace or "default", "swe-start-config", kubeconfig=str(cluster.kubeconfig)
    )
    assert await source.current() == InEffect(concurrency=3, workers=2)
    assert await starting_concurrency(3, source, worker_index=1) == 1  # not the spec's 3
    absent = ConfigMapSource(
        kubectl.namespace or "default", "no-such-config", kubeconfig=str(cluster.kubeconfig)
    )
    assert await starting_concurrency(3, absent, worker_index=1) == 3


class _NeverChanges(RuntimeFileSource):
    """The mounted file, with a first reading that never comes (the kubelet's minute)."""

    async def changes(self) -> AsyncIterator[InEffect]:
        await asyncio.Event().wait()
        yield InEffect(concurrency=0)  # pragma: no cover


async def test_open_rollout_starts_from_the_in_effect_share_before_the_first_reading(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runtime.yaml"
    path.write_text(runtime_yaml(2, workers=2))  # a quota admits 2 of the spec's 6
    async with _worker_1_of_2(_NeverChanges(path)) as scheduler:
        assert scheduler.concurrency == 1  # 2 over 2 workers, not the spec's 3
