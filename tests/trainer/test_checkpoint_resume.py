"""Checkpoints restore weights, optimizer, counters and the data order; restarts are counted."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.api.trainer import TrainerSpec
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.tiny import policy as tiny
from agentrl.trainer.batching import TrainSample, generated_spans
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.loop import TaskOrder, TaskStream
from agentrl.trainer.torch_backend import TorchBackend
from tests.trainer.factories import make_trajectory


def _sample(adv: float) -> TrainSample:
    t = make_trajectory("a#0", 1.0, tokens=([2, 8, 10, 3], [0.0, 0.0, -1.0, -1.0], [0, 0, 1, 1]))
    return TrainSample(trajectory=t, advantage=adv, carries_loss=True)


def test_generated_spans_are_the_runs_of_ones_in_the_loss_mask() -> None:
    assert generated_spans([0, 1, 1, 0, 0, 1, 0, 1]) == [(1, 3), (5, 6), (7, 8)]


def test_a_positive_advantage_step_raises_the_logprob_of_its_tokens() -> None:
    backend = TorchBackend(
        tiny.new_policy(0, dim=16),
        TrainerSpec(backend="torch", gpus_per_node=0, optimizer={"lr": 0.05}),
        temperature=1.0,
    )
    sample = _sample(1.0)
    ids = sample.trajectory.token_ids
    with torch.no_grad():
        before = float(tiny.sequence_logprobs(backend.model, ids, [(2, 4)]).sum())
    backend.train_step([sample])
    with torch.no_grad():
        after = float(tiny.sequence_logprobs(backend.model, ids, [(2, 4)]).sum())
    assert after > before


def test_a_resumed_backend_has_the_same_weights_optimizer_and_counters(tmp_path: Path) -> None:
    spec = TrainerSpec(backend="torch", gpus_per_node=0, optimizer={"lr": 0.05})
    backend = TorchBackend(tiny.new_policy(0, dim=16), spec, temperature=1.0)
    backend.train_step([_sample(1.0)])
    store = CheckpointStore(tmp_path)
    state = DriverState(step=7, task_cursor=12, pending_positions=[10, 11])
    state.counters.trajectories = 99
    store.save(backend, state)

    fresh = TorchBackend(tiny.new_policy(1, dim=16), spec, temperature=1.0)
    restored = store.load(fresh)
    assert restored is not None
    assert (restored.step, restored.task_cursor, restored.pending_positions) == (7, 12, [10, 11])
    assert restored.counters.trajectories == 99
    assert restored.restarts == 1  # the resume is counted
    for a, b in zip(backend.model.parameters(), fresh.model.parameters(), strict=False):
        assert torch.equal(a, b)
    # Adam's step count came back too (one update happened before the checkpoint).
    state_a = backend.optimizer.state_dict()["state"][0]["step"]
    state_b = fresh.optimizer.state_dict()["state"][0]["step"]
    assert float(state_a) == float(state_b) == 1.0


def test_the_store_keeps_the_newest_checkpoints_only(tmp_path: Path) -> None:
    spec = TrainerSpec(backend="torch", gpus_per_node=0)
    backend = TorchBackend(tiny.new_policy(0, dim=8), spec, temperature=1.0)
    store = CheckpointStore(tmp_path, keep=2)
    for step in (1, 2, 3):
        store.save(backend, DriverState(step=step))
    assert store.steps() == [2, 3]
    assert store.latest() == tmp_path / "step-00000003"


def test_a_resumed_task_stream_replays_pending_positions_then_continues_the_order() -> None:
    order = TaskOrder(generate_toy_tasks(0)[:10], seed=3)
    first = TaskStream(order, cursor=0, pending=[])
    handed = [next(first).id for _ in range(5)]
    # positions 0..4 handed out; 0, 1, 2 trained; 3 and 4 still in flight at the checkpoint
    for n in range(3):
        first.retire(f"x#{n}")
    assert sorted(first.outstanding) == [3, 4]
    resumed = TaskStream(order, cursor=first.cursor, pending=sorted(first.outstanding))
    again = [next(resumed).id for _ in range(3)]
    assert again == [handed[3], handed[4], order[5].id]
