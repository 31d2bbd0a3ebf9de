"""``agentrl trainer``: what it reads from the pod (env, ConfigMap files), the progress it writes
on its pod, and a dry run that builds everything from a rendered ConfigMap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentrl.api.validation import load_job
from agentrl.api.wire import TrainerProgress
from agentrl.reconcile import configmap
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import pod_from_object
from agentrl.reconcile.policies.suspend import workload_scale
from agentrl.reconcile.trainer import trainer_env
from agentrl.trainer.checkpoint import Counters, DriverState
from agentrl.trainer.cli import trainer
from agentrl.trainer.config import TrainerEnv, load_config
from agentrl.trainer.loop import StepRecord, StepTimes
from agentrl.trainer.progress import (
    FakeProgressReporter,
    ProgressTracker,
    progress_of,
    to_annotation,
)

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def _write_configmap(directory: Path, text: str) -> Path:
    """The ConfigMap the operator renders for the job, as the pod sees it mounted."""
    job = load_job(text)
    cm = configmap.config_map(job, BuildContext.for_job(job), workload_scale(job))
    for key, value in cm["data"].items():
        (directory / key).write_text(value)
    return directory / "job.yaml"


def test_the_env_the_operator_sets_gives_rank_and_world_size() -> None:
    job = load_job(QUICKSTART.read_text())
    job.spec.trainer.nodes, job.spec.trainer.gpus_per_node = 2, 8
    env = {
        e["name"]: e["value"]
        for e in trainer_env(job, BuildContext.for_job(job), attempt=1)
        if "value" in e
    }
    env |= {"NODE_RANK": "1", "POD_NAME": "q-trainer-1-abc", "POD_NAMESPACE": "team"}
    parsed = TrainerEnv.from_environ({**env, "LOCAL_RANK": "3"})
    assert parsed.world_size == 16  # 2 nodes × 8 GPUs
    assert parsed.rank == 11  # node 1 × 8 + local rank 3
    assert parsed.attempt == 1
    assert parsed.config == Path("/etc/agentrl/job.yaml")
    assert parsed.checkpoint_dir == Path("/checkpoints")
    assert parsed.master_port == int(env["MASTER_PORT"])
    assert parsed.master_addr == env["MASTER_ADDR"]


def test_a_cpu_only_pod_runs_one_rank() -> None:
    assert TrainerEnv.from_environ({"GPUS_PER_NODE": "0", "NNODES": "1"}).world_size == 1


def test_the_config_is_the_resolved_manifest_and_the_runtime_file_beside_it(
    tmp_path: Path,
) -> None:
    spec_file = _write_configmap(tmp_path, QUICKSTART.read_text())
    config = load_config(TrainerEnv(config=spec_file))
    assert config.job.metadata.name == load_job(QUICKSTART.read_text()).metadata.name
    assert len(config.runtime.engines.urls) == config.job.spec.inference.engines
    assert config.runtime.engines.urls[0].endswith(":30000")


def _record(step: int) -> StepRecord:
    return StepRecord(
        step=step,
        wall_seconds=1.0,
        trajectories=8,
        tokens=100,
        reward_mean=0.25,
        pass_rate=0.25,
        classes={},
        infra_errors=0,
        loss=0.1,
        grad_norm=1.0,
        clip_fraction=0.0,
        mismatch_abs_mean=0.0,
        ess=1.0,
        correction_fraction=0.0,
        zero_variance_share=0.0,
        staleness_mean=0.0,
        staleness_max=0,
        in_flight=4,
        weight_version=step,
        times=StepTimes(actor_update=1, waiting_for_rollout=0, logprob_recompute=0, weight_sync=0),
    )


def test_progress_carries_the_step_rates_and_the_last_checkpoint() -> None:
    state = DriverState(
        step=4,
        counters=Counters(
            trajectories=40,
            trained_trajectories=32,
            infra_errors=2,
            classes={"completed": 30, "truncated": 8, "infra_error": 2},
        ),
    )
    progress = progress_of(_record(4), state, last_checkpoint_step=2, hours=0.5)
    assert progress.step == 4
    assert progress.last_checkpoint_step == 2
    assert progress.weight_version == "4"
    assert progress.trajectories_per_hour == 64.0  # 32 trained in half an hour
    assert progress.infra_error_rate == 0.05  # 2 of 40
    assert progress.truncated_rate == 0.2  # 8 of 40
    assert progress.mean_reward == 0.25


def test_the_annotation_is_the_camel_case_json_the_operator_reads() -> None:
    progress = TrainerProgress(step=3, last_checkpoint_step=2, weight_version="3")
    text = to_annotation(progress)
    assert json.loads(text)["lastCheckpointStep"] == 2
    pod = {"metadata": {"name": "t-0", "annotations": {"agentrl.dev/progress": text}}}
    assert pod_from_object(pod).progress == progress  # the operator's own reading


async def test_every_step_is_reported_through_the_reporter() -> None:
    fake = FakeProgressReporter()
    tracker = ProgressTracker(fake, state=DriverState(step=1))

    class Driver:
        _last_checkpoint = 1

    tracker.on_step(_record(1), Driver())
    tracker.on_step(_record(2), Driver())
    await tracker.flush()
    assert [(p.step, p.last_checkpoint_step) for p in fake.reports] == [(1, 1), (2, 1)]


@pytest.mark.slow
def test_a_dry_run_builds_backend_clients_and_weight_sync_and_exits(tmp_path: Path) -> None:
    spec_file = _write_configmap(tmp_path, QUICKSTART.read_text())
    runtime = yaml.safe_load((tmp_path / "runtime.yaml").read_text())
    result = CliRunner().invoke(
        trainer,
        ["--config", str(spec_file), "--dry-run"],
        env={"AGENTRL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "NNODES": "1", "GPUS_PER_NODE": "0"},
    )
    assert result.exit_code == 0, result.output
    built = json.loads(result.output[result.output.index("{") :])
    assert built["backend"] == "torch"
    assert built["weight_sync"] == "DiskWeightSync"
    assert built["engines"] == runtime["engines"]["urls"]
    assert (built["world_size"], built["rank"], built["resume_step"]) == (1, 0, 0)
    assert built["checkpoint_dir"] == str(tmp_path / "ckpt" / "trainer")
    assert built["train_tasks"] > 0


@pytest.mark.parametrize(("pipeline", "fits"), [(2, True), (4, False)])
def test_a_megatron_dry_run_refuses_a_layout_the_model_cannot_be_split_into(
    tmp_path: Path, pipeline: int, fits: bool
) -> None:
    from tests.api.cases import BASE, merge

    model = tmp_path / "model"
    model.mkdir()
    # 2 layers: pipeline 2 gives a layer per stage; pipeline 4 passes the apply-time rules
    # (8 GPUs) but cannot split the model.
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"],
                "num_hidden_layers": 2,
                "hidden_size": 16,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 24,
                "vocab_size": 64,
            }
        )
    )
    manifest = merge(
        BASE,
        {
            "spec": {
                "model": {"source": {"path": str(model)}},
                "trainer": {"parallelism": {"pipeline": pipeline}},
            }
        },
    )
    spec_file = _write_configmap(tmp_path, yaml.safe_dump(manifest))
    result = CliRunner().invoke(
        trainer,
        ["--config", str(spec_file), "--dry-run"],
        env={"AGENTRL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "NNODES": "1", "GPUS_PER_NODE": "8"},
    )
    if fits:
        assert result.exit_code == 0, result.output
        built = json.loads(result.output[result.output.index("{") :])
        assert built["megatron"]["transformer"]["pipeline_model_parallel_size"] == 2
    else:
        assert result.exit_code != 0
        assert str(result.exception) == (
            "spec.trainer.parallelism does not fit Qwen2ForCausalLM: num_hidden_layers (2) "
            "must be divisible by parallelism.pipeline (4)"
        )
