"""Held-out evaluation's pure parts: the stratified sample and pass@1 with infra errors left
out of the denominator (expected values worked out by hand in each test)."""

from __future__ import annotations

import random
from collections import Counter

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.evaluation import score, stratified_sample, stratum_of
from agentrl.rollout.tasks.model import Task
from tests.rollout.fakes import toy_task
from tests.trainer.factories import make_trajectory


def _task(task_id: str, kind: str | None = None, source: str = "toy") -> Task:
    return toy_task(task_id).model_copy(update={"bug_kind": kind, "source": source})


def _tasks() -> list[Task]:
    # strata: off_by_one 6, wrong_op 3, typo 1 (10 tasks)
    return [
        *(_task(f"a{i}", "off_by_one") for i in range(6)),
        *(_task(f"b{i}", "wrong_op") for i in range(3)),
        _task("c0", "typo"),
    ]


def test_a_task_is_stratified_by_bug_kind_then_repository_then_source() -> None:
    assert stratum_of(_task("t", "off_by_one")) == "off_by_one"
    assert stratum_of(_task("django__django-11099", source="swebench")) == "django__django"
    assert stratum_of(_task("owner__repo.abc123-7", source="swesmith")) == "owner__repo.abc123"
    assert stratum_of(_task("hello-world", source="harbor")) == "harbor"


def test_seats_go_to_strata_in_proportion_and_leftovers_to_the_largest_remainders() -> None:
    # 5 of 10: off_by_one 5·6/10 = 3.0, wrong_op 1.5, typo 0.5 → floors 3, 1, 0 (4 seats);
    # the leftover seat goes to the largest remainder, a tie of .5 between wrong_op and typo
    # broken by name: typo → 3, 1, 1 (the one-task stratum is represented).
    chosen = stratified_sample(_tasks(), 5, seed=0)
    assert Counter(t.bug_kind for t in chosen) == {"off_by_one": 3, "wrong_op": 1, "typo": 1}
    # 4 of 10: 2.4, 1.2, 0.4 → floors 2, 1, 0; the leftover to the largest remainder .4, a tie
    # of off_by_one and typo broken by name: off_by_one → 3, 1, 0.
    chosen = stratified_sample(_tasks(), 4, seed=0)
    assert Counter(t.bug_kind for t in chosen) == {"off_by_one": 3, "wrong_op": 1}


def test_the_sample_depends_on_the_seed_not_on_the_list_order() -> None:
    tasks = _tasks()
    shuffled = list(tasks)
    random.Random(3).shuffle(shuffled)
    first = [t.id for t in stratified_sample(tasks, 5, seed=7)]
    assert [t.id for t in stratified_sample(shuffled, 5, seed=7)] == first
    assert first == sorted(first)
    seeds = {tuple(t.id for t in stratified_sample(tasks, 5, seed=s)) for s in range(10)}
    assert len(seeds) > 1


def test_a_split_smaller_than_asked_is_evaluated_whole_and_zero_asks_for_none() -> None:
    assert [t.id for t in stratified_sample(_tasks(), 100, seed=0)] == sorted(
        t.id for t in _tasks()
    )
    assert stratified_sample(_tasks(), 0, seed=0) == []


def test_pass_at_1_is_the_mean_over_tasks_of_successes_per_non_infra_attempt() -> None:
    infra = TerminalClass.INFRA_ERROR
    trajectories = [
        # task A: pass, infra error → 1 / 1 (the infra error is not a failure)
        make_trajectory("A#0", 1.0, n=0),
        make_trajectory("A#0", None, terminal=infra, n=1),
        # task B: pass, fail, fail → 1 / 3
        make_trajectory("B#1", 1.0, n=0),
        make_trajectory("B#1", 0.0, n=1),
        make_trajectory("B#1", 0.0, n=2),
        # task C: infra errors only → in no denominator
        make_trajectory("C#2", None, terminal=infra, n=0),
        make_trajectory("C#2", None, terminal=infra, n=1),
        # task D: a truncated attempt is a scored failure → 0 / 1
        make_trajectory("D#3", 0.0, terminal=TerminalClass.TRUNCATED, n=0),
    ]
    result = score(trajectories)
    # (1 + 1/3 + 0) / 3 tasks = 4/9
    assert abs(result.pass_at_1 - 4 / 9) < 1e-12
    assert (result.tasks, result.episodes, result.passed, result.infra_errors) == (3, 5, 2, 3)
    assert result.infra_reasons == {"unknown": 3}  # the factory's infra errors give no reason


def test_no_counted_attempt_gives_no_figure() -> None:
    infra = make_trajectory("A#0", None, terminal=TerminalClass.INFRA_ERROR)
    result = score([infra])
    assert result.pass_at_1 is None
    assert (result.episodes, result.infra_errors) == (0, 1)
    assert score([]).pass_at_1 is None
