"""Held-out evaluation: which tasks (stratified sample), how they are scored (pass@1 with infra
errors left out of the denominator), and running them through a rollout scheduler.

pass@1 is the mean over tasks of ``successes / attempts that did not end in an infra error``;
a task whose every attempt was an infra error counts in no denominator (it says nothing about
the policy). Infra-error attempts are counted and reported beside the figure.

Callers: :mod:`agentrl.trainer.evaluation` (the driver's periodic evaluation, on a cluster and in
``agentrl run``) and :mod:`agentrl.local.runner` (the final evaluation of ``agentrl run``).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from pydantic import BaseModel, Field

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.admission import OpenAdmission
from agentrl.rollout.scheduler import Episodes, RolloutScheduler, SlottedEpisodes
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory

_INSTANCE_NUMBER = re.compile(r"-\d+$")


class Evaluation(BaseModel):
    """Held-out pass@1 at one weight version."""

    pass_at_1: float | None
    """Mean over tasks of successes / non-infra attempts; None when no attempt counted."""
    episodes: int
    """Attempts that counted (did not end in an infra error)."""
    passed: int
    """Attempts whose tests passed (reward 1)."""
    infra_errors: int
    """Attempts that ended in an infra error (excluded from pass@1, never failures)."""
    tasks: int = 0
    """Tasks with at least one counted attempt."""
    episode_seconds: float = 0.0
    """Wall seconds of all its episodes, summed (its share of the rollout tier's time)."""
    infra_reasons: dict[str, int] = Field(default_factory=dict)
    """Why attempts ended in an infra error (the reason's first 120 characters → attempts)."""
    weight_versions: list[str] = Field(default_factory=list)
    """The weight versions the engines served its episodes, in order of first use (an
    evaluation beside training may span several)."""


def stratum_of(task: Task) -> str:
    """The stratum a task is sampled in: the toy tasks' bug kind; the SWE tasks' repository
    (the instance id without its trailing number, ``owner__repo``); else the task source."""
    if task.bug_kind:
        return task.bug_kind
    if task.source in ("swebench", "swesmith") and _INSTANCE_NUMBER.search(task.id):
        return _INSTANCE_NUMBER.sub("", task.id)
    return task.source


def stratified_sample(tasks: Sequence[Task], count: int, seed: int) -> list[Task]:
    """``count`` tasks (all when there are fewer), allocated to strata in proportion to their
    size (largest remainders get the leftover seats, ties to the stratum name), chosen within a
    stratum by ``seed``; independent of the list's order. Returned sorted by id."""
    if count >= len(tasks):
        return sorted(tasks, key=lambda t: t.id)
    if count <= 0:
        return []
    strata: dict[str, list[Task]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.id):
        strata[stratum_of(task)].append(task)
    total = len(tasks)
    quotas = {name: count * len(members) // total for name, members in strata.items()}
    left = count - sum(quotas.values())
    by_remainder = sorted(strata, key=lambda name: (-(count * len(strata[name]) % total), name))
    for name in by_remainder[:left]:
        quotas[name] += 1
    chosen: list[Task] = []
    for name in sorted(strata):
        members = list(strata[name])
        random.Random(f"{seed}:{name}").shuffle(members)
        chosen.extend(members[: quotas[name]])
    return sorted(chosen, key=lambda t: t.id)


def score(trajectories: Iterable[Trajectory]) -> Evaluation:
    """pass@1 of the attempts (see the module docstring); tasks are told apart by task id."""
    per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # [passed, counted]
    infra = 0
    seconds = 0.0
    versions: dict[str, None] = {}
    reasons: dict[str, int] = {}
    for t in trajectories:
        seconds += t.timings.total_seconds
        versions.update(dict.fromkeys(t.weight_versions))
        if t.terminal_class == TerminalClass.INFRA_ERROR:
            infra += 1
            reason = (t.infra_reason or "unknown")[:120]
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        counts = per_task[t.task_id]
        counts[1] += 1
        counts[0] += (t.reward or 0.0) >= 1.0
    rates = [passed / counted for passed, counted in per_task.values()]
    return Evaluation(
        pass_at_1=sum(rates) / len(rates) if rates else None,
        episodes=sum(c for _, c in per_task.values()),
        passed=sum(p for p, _ in per_task.values()),
        infra_errors=infra,
        tasks=len(rates),
        episode_seconds=seconds,
        infra_reasons=reasons,
        weight_versions=sorted(versions, key=lambda v: (len(v), v)),
    )


class _SharedSlots:
    """A :class:`SlottedEpisodes` runner (worker actors, or the
    :class:`~agentrl.rollout.scheduler.GatedEpisodes` over a runner in this process) seen as a
    plain one, so the evaluation's scheduler neither resets the runner's cap nor withdraws
    training's orders: its episodes wait for the same slots as training's (the job's
    concurrency is shared, never exceeded)."""

    def __init__(self, inner: Episodes) -> None:
        self.inner = inner

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        return await self.inner.run(task, group_id=group_id, policy_version=policy_version)


async def run_evaluation(
    runner: Episodes,
    tasks: Sequence[Task],
    *,
    attempts: int,
    concurrency: int,
    on_scheduler: Callable[[RolloutScheduler], None] | None = None,
) -> Evaluation:
    """Score ``attempts`` episodes of each task, run by ``runner`` at most ``concurrency`` at
    a time, admitted at any weight version (they are never trained on). ``on_scheduler`` gets
    the running scheduler (to change its concurrency while it runs). A runner training also
    uses must be a :class:`SlottedEpisodes` (worker actors, or a
    :class:`~agentrl.rollout.scheduler.GatedEpisodes`): the evaluation's episodes then take
    slots of the job's concurrency, never more."""
    if not tasks:
        return Evaluation(pass_at_1=None, episodes=0, passed=0, infra_errors=0)
    if isinstance(runner, SlottedEpisodes):
        runner = _SharedSlots(runner)
    scheduler = RolloutScheduler(
        runner=runner,
        tasks=list(tasks),
        concurrency=max(1, concurrency),
        group_size=attempts,
        admission=OpenAdmission(),
        export_metrics=False,  # the concurrency gauges are training's
    )
    if on_scheduler is not None:
        on_scheduler(scheduler)
    trajectories: list[Trajectory] = []
    async with scheduler:
        async for t in scheduler.trajectories():
            trajectories.append(t)
    return score(trajectories)
