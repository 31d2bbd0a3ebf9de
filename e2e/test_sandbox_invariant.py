"""The sandbox invariant on the local control plane: never more live sandbox pods than the
concurrency in effect, over 1,000 episodes, with the concurrency raised and lowered mid-run.

Everything on the episode path is real except the model: the :class:`RolloutScheduler`, the
:class:`EpisodeRunner` with the token-level agent, the verifier, and the kubernetes sandbox
provider talking to kube-apiserver (pods created from the job's hardened template, scheduled,
started by kwok, commands through the exec subresource, deleted at episode end). The engine is
an in-process double that answers ``apply wrong_constant`` (the task's candidate edit: the fix)
then ``submit``, so every episode does a little exec work (write the repository, apply the edit,
run the test command, each through the exec subresource) and earns reward 1 only if that work
really happened in its pod's directory.

Live pods are counted from the API server itself: a watch on pods with the job's sandbox
labels, started from a consistent list, counts pods not yet deleted after every event, in the
API server's own order (resourceVersion). A concurrency phase is checked from the list taken
where it provably began: for a raise, just before the scheduler was told; for a lowering, once
the scheduler's episodes in flight had drained to the new figure (running episodes are never
killed, so until then the old figure is the one in effect).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.factories import make_job, sandbox_pods_of

from agentrl.api import AgentRLJob
from agentrl.api.rollout import TerminalClass
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from agentrl.engine_client.client import FinishReason, GenerateResponse, MetaInfo, SamplingParams
from agentrl.rollout.agent import TokenAgent, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.tasks.model import CandidateEdit, NamedTestsVerification, Task
from agentrl.rollout.trajectory import Trajectory
from agentrl.sandbox.kubernetes import (
    KubeApiTransport,
    KubernetesProvider,
)
from agentrl.tiny.tokenizer import get_tokenizer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.usefixtures("crd_installed"),
    # About 0.15 CPU-seconds per episode (API server, kwok, etcd and this process together),
    # so 1,000 episodes take 1.5-2 minutes on two idle cores; the margin is for shared CI hosts.
    pytest.mark.timeout(900),
]

EPISODES = 1000
TEST_ID = "tests/test_app.py::test_value"
#: The fix as the tiny policy's text action (an edit name in its vocabulary).
FIX = "apply wrong_constant"
#: (concurrency, episodes finished before the next change): start at 24, raise to 32, lower to
#: 8, raise back to 24 for the rest.
PHASES: Sequence[tuple[int, int]] = ((24, 250), (32, 550), (8, 640), (24, EPISODES))


class ApplyThenSubmitEngine:
    """``/generate`` double: the fix (the task's candidate edit) on an episode's first turn,
    ``submit`` after (a tool observation in the context means the first turn is done)."""

    base_url = "http://engine-double"

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.tok = get_tokenizer()

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        await asyncio.sleep(self.latency)
        text = "submit" if self.tok.role_ids["tool"] in input_ids else FIX
        ids = [*self.tok.encode(text), self.tok.eos_id]
        return GenerateResponse(
            text=text,
            output_ids=ids,
            meta_info=MetaInfo(
                finish_reason=FinishReason(type="stop"),
                output_token_logprobs=[(-0.5, i, None) for i in ids],
            ),
        )

    async def health(self, *, timeout: float = 10.0) -> bool:
        return True


def tasks(root: Path) -> Iterator[Task]:
    """One task per episode, each in its own directory (kwok runs every pod's commands on this
    machine, so pods share a filesystem; a directory per task keeps episodes apart)."""
    for number in itertools.count():
        yield Task(
            id=f"t{number}",
            source="toy",
            instruction="Make test_value pass.",
            workdir=str(root / f"t{number}"),
            files={"app.py": "VALUE = 'BUG'\n"},
            candidate_edits=[
                CandidateEdit(name="wrong_constant", path="app.py", old="'BUG'", new="'OK'")
            ],
            verification=NamedTestsVerification(
                fail_to_pass=[TEST_ID],
                # What pytest would print, without starting a Python per episode.
                test_command=f"if grep -q \"'OK'\" app.py; then echo 'PASSED {TEST_ID}'; "
                f"else echo 'FAILED {TEST_ID}'; fi",
            ),
        )


@dataclass
class PodCounter:
    """Live sandbox pods after every watch event, in the API server's order."""

    events: list[tuple[int, int]] = field(default_factory=list)
    """(resourceVersion, live pods after the event)."""
    live: set[str] = field(default_factory=set)
    created: int = 0


async def consistent_list(client: Any, namespace: str, labels: dict[str, str]) -> tuple[int, int]:
    """(resourceVersion, pods) of a quorum list: the state at that version."""
    from lightkube.resources.core_v1 import Pod

    listing = client.list(Pod, namespace=namespace, labels=labels)
    names = [pod.metadata.name async for pod in listing]
    # resourceVersions are etcd revisions on this (etcd-backed) server, so they order events.
    return int(listing.resourceVersion), len(names)


async def count_pods(
    client: Any, namespace: str, labels: dict[str, str], since: str, counter: PodCounter
) -> None:
    from lightkube.resources.core_v1 import Pod

    async for kind, pod in client.watch(
        Pod, namespace=namespace, labels=labels, resource_version=since
    ):
        name = pod.metadata.name
        if kind == "ADDED":
            counter.live.add(name)
            counter.created += 1
        elif kind == "DELETED":
            counter.live.discard(name)
        counter.events.append((int(pod.metadata.resourceVersion), len(counter.live)))


#: Tiny sandboxes created fast, starting at the first phase's concurrency.
JOB = (
    make_job("inv", None)
    .with_model_path("tiny")
    .with_rollout(maxTurns=4, maxTrajectoryTokens=2048, maxTokensPerTurn=16)
    .with_sandbox(
        concurrency=PHASES[0][0],
        cpu="10m",
        memory="16Mi",
        startupTimeoutSeconds=60,
        maxCreatesPerSecond=500,
    )
)


async def test_a_thousand_episodes_never_hold_more_live_sandbox_pods_than_the_concurrency(
    cluster: ClusterHandle, kubectl: Kubectl, tmp_path: Path
) -> None:
    from lightkube import AsyncClient, KubeConfig

    namespace = kubectl.namespace or "default"
    kubectl.apply(JOB.manifest())
    job = AgentRLJob.model_validate(kubectl.json("get", "arj", "inv"))
    # the pod template the operator's builder writes into the job's runtime.yaml, as the
    # workers get it (no operator runs here: the scheduler is told the concurrency directly)
    pods = sandbox_pods_of(job)
    # every sandbox pod of the job carries these (docs/operations.md); written out, not derived
    labels = {"agentrl.dev/job": "inv", "app.kubernetes.io/component": "sandbox"}
    provider = KubernetesProvider(
        transport=KubeApiTransport(namespace, kubeconfig=str(cluster.kubeconfig)),
        pods=pods,
        worker_id="invariant",
        creates_per_second=job.spec.sandbox.max_creates_per_second,
    )
    caps = EpisodeCaps.from_spec(job.spec)
    runner = EpisodeRunner(
        provider=provider,
        agent=TokenAgent(EnginePool([ApplyThenSubmitEngine(0.02)]), WordTurnTokenizer(), caps),
        caps=caps,
        failure_policy=job.spec.rollout.failure_policy,
    )
    scheduler = RolloutScheduler(
        runner=runner,
        tasks=itertools.islice(tasks(tmp_path), EPISODES),
        concurrency=PHASES[0][0],
    )
    client = AsyncClient(
        config=KubeConfig.from_file(str(cluster.kubeconfig)).get(), namespace=namespace
    )
    counter = PodCounter()
    start_rv, start_pods = await consistent_list(client, namespace, labels)
    assert start_pods == 0
    watch = asyncio.create_task(count_pods(client, namespace, labels, str(start_rv), counter))
    # (concurrency, resourceVersion from which it alone is in effect, pods live at that version)
    checkpoints: list[tuple[int, int, int]] = [(PHASES[0][0], start_rv, 0)]
    trajectories: list[Trajectory] = []
    try:
        phase = 0
        async for trajectory in scheduler.trajectories():
            trajectories.append(trajectory)
            if phase + 1 < len(PHASES) and len(trajectories) == PHASES[phase][1]:
                phase += 1
                new = PHASES[phase][0]
                if new > scheduler.concurrency:
                    rv, live = await consistent_list(client, namespace, labels)
                    scheduler.set_concurrency(new)
                    checkpoints.append((new, rv, live))
                else:
                    scheduler.set_concurrency(new)
                    while scheduler.in_flight > new:
                        await asyncio.sleep(0.05)
                    rv, live = await consistent_list(client, namespace, labels)
                    checkpoints.append((new, rv, live))
        final_rv, final_pods = await consistent_list(client, namespace, labels)
        # Every event up to the final list has arrived once the watch has seen each pod's
        # ADDED and DELETED: with no pod left at final_rv, a pod's last event before it is its
        # deletion, and the watch delivers in resourceVersion order. (final_rv itself is the
        # store's revision, which every other write in the cluster advances: no pod event need
        # ever reach it.)
        for _ in range(1200):
            if counter.created >= EPISODES and not counter.live:
                break
            await asyncio.sleep(0.05)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await scheduler.cancel()
        await provider.aclose()
        await client.close()

    # Every episode ran its exec work in a real pod: the edit made the test pass.
    assert len(trajectories) == EPISODES
    classes = {t.terminal_class for t in trajectories}
    assert classes == {TerminalClass.COMPLETED}, [t.infra_reason for t in trajectories][:5]
    assert all(t.reward == 1.0 for t in trajectories)
    assert counter.created == EPISODES  # one pod per episode (no infra retries happened)
    assert final_pods == 0 and counter.live == set()

    # Each phase, from where it alone is in effect to where the next one begins.
    bounds = [rv for _, rv, _ in checkpoints[1:]] + [final_rv]
    for (concurrency, since, live_then), until in zip(checkpoints, bounds, strict=True):
        assert live_then <= concurrency
        during = [n for v, n in counter.events if since < v <= until]
        # never above the figure, and the figure reached: configured is achieved concurrency
        assert max(during) == concurrency, (concurrency, max(during))
    # Over the whole run: 32 is the largest concurrency ever set.
    assert max(n for _, n in counter.events) == 32
