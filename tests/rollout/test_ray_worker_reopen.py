"""The driver's reopening of a rollout worker actor after its death
(:meth:`RemoteEpisodes._reopen`), with a fake actor that answers as Ray's does: ``ActorDiedError``
means "gone for good" only when Ray's control store says the actor is DEAD. A call that
reached the dead incarnation before Ray marked the actor restarting fails with it too; giving
up then stalled a run whose two rollout pods an image roll replaced at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.rollout import ray_workers
from agentrl.rollout.ray_workers import RemoteEpisodes
from tests.factories import from_manifest

ray = pytest.importorskip("ray", reason="the ray extra")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-cluster.yaml"


class _Method:
    """``actor.<method>``: each ``.remote()`` answers the next of ``answers`` (the last one
    again and again); an exception is raised by the awaited call, ``...`` never answers."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def remote(self, *_args: Any, **_kwargs: Any) -> asyncio.Future[Any]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        elif answer is not ...:
            future.set_result(answer)
        return future


class _Actor:
    def __init__(self, *open_answers: Any) -> None:
        self.open = _Method(*open_answers)
        self.collect = _Method(...)
        self.submit = _Method(...)


def _dead() -> BaseException:
    return ray.exceptions.ActorDiedError()


def _restarting() -> BaseException:
    return ray.exceptions.ActorUnavailableError("restarting", b"\0" * 16)


STATS = {"worker_index": 0, "pid": 4242}


async def _reopen(actor: _Actor, state: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(ray_workers, "actor_state", lambda _actor: state)
    monkeypatch.setattr(ray_workers, "REOPEN_BACKOFF_SECONDS", (0.01, 0.02))
    spec = from_manifest(yaml.safe_load(EXAMPLE.read_text())).obj().spec
    episodes = RemoteEpisodes([actor], spec)
    episodes._started = True
    worker = episodes.workers[0]
    worker.alive = False
    await asyncio.wait_for(episodes._reopen(worker), timeout=10)
    for task in (worker.collector, worker.sender):
        if task is not None:
            task.cancel()
    return worker


async def test_a_worker_answering_dead_while_ray_restarts_it_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actor = _Actor(_dead(), _restarting(), _dead(), STATS)
    worker = await _reopen(actor, "RESTARTING", monkeypatch)
    assert actor.open.calls == 4
    assert (worker.alive, worker.restarts, worker.pid) == (True, 1, 4242)


async def test_a_worker_ray_says_is_dead_is_given_up_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actor = _Actor(_dead(), STATS)
    worker = await _reopen(actor, "DEAD", monkeypatch)
    assert actor.open.calls == 1
    assert (worker.alive, worker.restarts) == (False, 0)


async def test_when_ray_cannot_say_a_dead_answer_is_taken_as_final(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actor = _Actor(_dead(), STATS)
    worker = await _reopen(actor, None, monkeypatch)
    assert actor.open.calls == 1
    assert worker.alive is False
