"""The warm-start stage (``spec.trainer.warmStart``) on the real model format: conversations in the
OpenAI messages + tools format, rendered with the rollout's template and tools of the Qwen3
model made here, trained by the torch backend, checkpointed, resumed, then pushed to the
engines before RL.

Independent checks: the number of updates is counted from the batch budget by hand (each
conversation is longer than half a batch, so one per batch); a stage stopped and resumed from
its checkpoint ends with exactly the weights of an uninterrupted one, update by update; refused
lines name their line numbers in the file as written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.api import AgentRLJob
from agentrl.api.model import ModelSpec
from agentrl.api.trainer import TrainerSpec, WarmStartSpec
from agentrl.rollout.conversations import job_turn_tokenizer, read_warm_start
from agentrl.trainer import hf_model
from agentrl.trainer.assembly import TaskSplit, build_parts, restore_state, warm_up
from agentrl.trainer.checkpoint import CheckpointStore, DriverState, WarmStartProgress
from agentrl.trainer.torch_backend import TorchBackend
from agentrl.trainer.warm_start import (
    WARM_START_LOG,
    WarmStart,
    WarmStartDataError,
    checked_conversations,
)

TRAINER = TrainerSpec(
    backend="torch",
    gpus_per_node=0,
    checkpoint={"intervalSteps": 3},
    algorithm={"klCoef": 0.1},  # RL keeps a KL reference: the warm start must hand it over
)
#: Each conversation renders to ~1,100 tokens with the tool schemas: one per 2,048-token batch.
TOKENS_PER_BATCH = 2048


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_model.create_model(tmp_path_factory.mktemp("qwen3") / "model", seed=0)


def _conversation(i: int) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": f"The test t{i} fails. Fix it."},
            {
                "role": "assistant",
                "content": "Let me run the tests.",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "bash", "arguments": {"command": f"pytest -q t{i}"}},
                    }
                ],
            },
            {"role": "tool", "content": f"1 failed: t{i}"},
            {
                "role": "assistant",
                "content": "Fixed; submitting.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "submit", "arguments": {}}}
                ],
            },
        ]
    }


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return _write(tmp_path / "warm.jsonl", [json.dumps(_conversation(i)) for i in range(4)])


def _turns(model_dir: Path) -> Any:
    model = ModelSpec.model_validate(
        {"source": {"path": str(model_dir)}, "toolCallParser": "qwen25"}
    )
    return job_turn_tokenizer(model)


def _backend(model_dir: Path) -> TorchBackend:
    return TorchBackend(
        hf_model.load_causal_lm(model_dir), TRAINER, temperature=1.0, source=model_dir
    )


def _stage(
    model_dir: Path, dataset: Path, root: Path, *, backend: TorchBackend, state: DriverState
) -> WarmStart:
    spec = WarmStartSpec(dataset=str(dataset), epochs=2, lr=3e-3, tokens_per_batch=TOKENS_PER_BATCH)
    report = read_warm_start(dataset, _turns(model_dir), tokens_per_batch=TOKENS_PER_BATCH)
    return WarmStart(
        spec,
        TRAINER,
        checked_conversations(report, str(dataset)),
        backend=backend,
        checkpoints=CheckpointStore(root / "checkpoints"),
        state=state,
        log_path=root / WARM_START_LOG,
    )


def _losses(log: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in log.read_text().splitlines()]


def test_the_stage_trains_every_batch_of_every_epoch_then_hands_rl_its_weights(
    model_dir: Path, dataset: Path, tmp_path: Path
) -> None:
    backend = _backend(model_dir)
    seen: list[WarmStartProgress] = []
    stage = _stage(model_dir, dataset, tmp_path, backend=backend, state=DriverState())
    stage.on_progress = seen.append
    progress = stage.run()

    # 4 conversations, one per batch, 2 epochs
    assert progress.done and progress.updates == progress.total_updates == 8
    assert [p.updates for p in seen] == list(range(1, 9))
    assert [p.epoch for p in seen] == [0] * 4 + [1] * 4
    losses = _losses(tmp_path / WARM_START_LOG)
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0]
    assert progress.first_loss == losses[0] and progress.loss == losses[-1]
    # RL's KL reference is the warm-started model
    assert backend.reference is not None
    for (name, a), (_, b) in zip(
        backend.model.named_parameters(), backend.reference.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    # the last checkpoint is step 0, marked done: a restart does not train it again
    saved = json.loads((tmp_path / "checkpoints" / "step-00000000" / "driver.json").read_text())
    assert saved["step"] == 0 and saved["warm_start"]["done"] is True
    assert saved["warm_start"]["updates"] == 8


def test_a_restart_in_the_middle_resumes_at_the_next_batch_and_ends_identically(
    model_dir: Path, dataset: Path, tmp_path: Path
) -> None:
    whole = _backend(model_dir)
    _stage(model_dir, dataset, tmp_path / "whole", backend=whole, state=DriverState()).run()

    # stopped after 5 updates (the interval checkpoint was at 3; the stop checkpoints at 5)
    first = _backend(model_dir)
    stage = _stage(model_dir, dataset, tmp_path / "cut", backend=first, state=DriverState())
    stage.run(should_stop=lambda: stage.progress.updates == 5)
    assert not stage.progress.done and stage.progress.updates == 5
    assert (stage.progress.epoch, stage.progress.batch) == (1, 1)

    # a new process: fresh model from the directory, state and weights from the checkpoint
    resumed = _backend(model_dir)
    state = restore_state(CheckpointStore(tmp_path / "cut" / "checkpoints"), resumed)
    assert state.warm_start is not None and state.warm_start.updates == 5
    assert state.restarts == 1
    done = _stage(model_dir, dataset, tmp_path / "cut", backend=resumed, state=state).run()
    assert done.done and done.updates == 8

    assert _losses(tmp_path / "cut" / WARM_START_LOG) == _losses(
        tmp_path / "whole" / WARM_START_LOG
    )
    for (name, a), (_, b) in zip(
        whole.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_refused_lines_stop_the_job_before_anything_is_trained(
    model_dir: Path, tmp_path: Path
) -> None:
    bad_tool = _conversation(1)
    bad_tool["messages"][1]["tool_calls"][0]["function"]["name"] = "browse"
    path = _write(
        tmp_path / "warm.jsonl",
        [json.dumps(_conversation(0)), "{not json", json.dumps(bad_tool)],
    )
    report = read_warm_start(path, _turns(model_dir), tokens_per_batch=TOKENS_PER_BATCH)
    with pytest.raises(WarmStartDataError) as refused:
        checked_conversations(report, str(path))
    text = str(refused.value)
    assert "2 refused line(s) of 3" in text
    assert f"{path}:2:" in text and f"{path}:3:" in text and "browse" in text
    assert "agentrl tasks validate" in text


class _Pushes:
    """The weight sync as the stage's caller sees it: records what it was asked to push."""

    def __init__(self) -> None:
        self.pushed: list[int] = []
        self.current_version = 0

    async def push(self, version: int) -> None:
        self.pushed.append(version)


def _job(model_dir: Path, dataset: Path) -> AgentRLJob:
    return AgentRLJob.model_validate(
        {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "metadata": {"name": "warm"},
            "spec": {
                "model": {"source": {"path": str(model_dir)}, "toolCallParser": "qwen25"},
                "dataset": {"format": "toy"},
                "inference": {"server": "tiny", "gpusPerEngine": 0},
                "trainer": {
                    "backend": "torch",
                    "gpusPerNode": 0,
                    "checkpoint": {"intervalSteps": 3},
                    "warmStart": {
                        "dataset": str(dataset),
                        "epochs": 1,
                        "lr": 3e-3,
                        "tokensPerBatch": TOKENS_PER_BATCH,
                    },
                },
            },
        }
    )


async def test_warm_up_trains_then_pushes_the_weights_before_rl_and_never_twice(
    model_dir: Path, dataset: Path, tmp_path: Path
) -> None:
    spec = _job(model_dir, dataset).spec
    checkpoints = CheckpointStore(tmp_path / "checkpoints")
    sync = _Pushes()
    seen: list[WarmStartProgress] = []

    def parts(backend: TorchBackend, state: DriverState) -> Any:
        return build_parts(
            spec,
            tasks=TaskSplit.of(spec),
            backend=backend,
            checkpoints=checkpoints,
            state=state,
            weight_sync=sync,
        )

    progress = await warm_up(
        parts(_backend(model_dir), DriverState()),
        _turns(model_dir),
        log_dir=tmp_path,
        on_progress=seen.append,
    )
    assert progress is not None and progress.done and progress.updates == 4
    assert [p.updates for p in seen] == [0, 1, 2, 3, 4]  # announced before the first update
    assert sync.pushed == [0]

    # a restart after the stage, before RL's first step: not trained again, pushed again
    backend = _backend(model_dir)
    state = restore_state(checkpoints, backend)
    again = await warm_up(parts(backend, state), _turns(model_dir), log_dir=tmp_path)
    assert again is not None and again.updates == 4
    assert len(_losses(tmp_path / WARM_START_LOG)) == 4
    assert sync.pushed == [0, 0]

    # once RL has stepped, the driver pushes its own weights: nothing to do here
    state.step = 7
    assert (
        await warm_up(parts(backend, state), _turns(model_dir), log_dir=tmp_path)
    ) == state.warm_start
    assert sync.pushed == [0, 0]


async def test_the_progress_annotation_says_warming_up_then_training_with_the_three_points() -> (
    None
):
    from agentrl.api.wire import TrainerStage
    from agentrl.rollout.evaluation import Evaluation
    from agentrl.trainer.evaluation import EvaluationRecord
    from agentrl.trainer.progress import FakeProgressReporter, ProgressTracker

    def record(stage: str, pass_at_1: float) -> EvaluationRecord:
        figures = Evaluation(pass_at_1=pass_at_1, episodes=4, passed=1, infra_errors=0, tasks=4)
        return EvaluationRecord(step=0, stage=stage, seconds=1.0, **figures.model_dump())

    reporter = FakeProgressReporter()
    state = DriverState(warm_start=WarmStartProgress(total_updates=4))
    tracker = ProgressTracker(reporter, state=state)
    tracker.on_evaluation(record("base", 0.25))
    tracker.on_warm_start(WarmStartProgress(total_updates=4, updates=1, loss=2.5))
    state.warm_start = WarmStartProgress(total_updates=4, updates=4, loss=1.5, done=True)
    tracker.on_warm_start(state.warm_start)
    tracker.on_evaluation(record("warm_start", 0.5))
    await tracker.flush()

    warming = reporter.reports[1]
    assert (warming.stage, warming.warm_start_progress, warming.warm_start_loss) == (
        TrainerStage.WARMING_UP,
        0.25,
        2.5,
    )
    last = reporter.reports[-1]
    assert (last.stage, last.warm_start_progress, last.warm_start_loss) == (
        TrainerStage.TRAINING,
        1.0,
        1.5,
    )
    assert (last.pass_at_1_base, last.pass_at_1_warm_start, last.pass_at_1) == (0.25, 0.5, 0.5)
