"""The trainer's memory per GPU (``agentrl.sim.memory``): figures worked by hand for a dense and
an MoE layout, ``agentrl validate`` refusing a job that cannot fit (naming the field and the
figure), the shipped examples passing, and ``agentrl plan`` reporting it (text and --json).

Hand arithmetic, shared by the tests below (B = bytes; MI355X: 288 GiB = 309,237,645,312 B;
runtime reserve 10 GiB = 10,737,418,240 B):

Qwen3-8B (36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288, vocab 151936,
untied), 8 GPUs at tensor 1, pipeline 1 → 8 data-parallel ranks, 32,768 tokens, klCoef 0:
  attention per layer  4096·4096 + 2·4096·1024 + 4096·4096             =    41,943,040
  MLP per layer        3·4096·12288                                     =   150,994,944
  36 layers            36 · 192,937,984                                 = 6,945,767,424
  embedding + output   2 · 151936·4096                                  = 1,244,659,712
  parameters per GPU                                                    = 8,190,427,136
  weights 2 B 16,380,854,272 + grads 4 B 32,761,708,544 + Adam 12 B / 8 ranks 12,285,640,704
  + reserve 10,737,418,240                                       fixed = 72,165,621,760
  per token: layer inputs 36·4096·2 = 294,912; logits 151936·8 = 1,215,488 (above one layer's
  working set: 2·2·(3·4096 + (2·32 + 2·8)·128 + 3·4096 + 3·12288) = 286,720)
                                                             per token = 1,510,400
  at 32,768 tokens: 72,165,621,760 + 32,768 · 1,510,400         = 121,658,408,960 B
  longest that fits: (309,237,645,312 − 72,165,621,760) // 1,510,400 = 156,959 tokens

Qwen3-30B-A3B (48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts of 768, top-8,
untied) at the report's layout: 8 GPUs, tensor 1, pipeline 2, expert 4 → 4 data-parallel ranks,
expert-data-parallel 8 / (1·4·2) = 1; 65,536 tokens; klCoef 0.01 (a bf16 reference copy);
64 trajectories per step / 4 ranks = 16 micro-batches, so the first stage holds 2 in flight:
  24 layers per stage; attention 2048·4096 + 2·2048·512 + 4096·2048 = 18,874,368, router
  2048·128 = 262,144: 24 · 19,136,512 = 459,276,288; + the stage's vocabulary matrix
  151936·2048 = 311,164,928                                    non-expert = 770,441,216
  experts 24 · 128·3·2048·768 / 4                                 expert = 3,623,878,656
  parameters per GPU                                                     = 4,394,319,872
  weights 8,788,639,744 + grads 17,577,279,488 + Adam 12·770,441,216/4 = 2,311,323,648 and
  12·3,623,878,656/1 = 43,486,543,872 + reference 8,788,639,744 + reserve 10,737,418,240
                                                                   fixed = 91,689,844,736
  one layer's working set per token: 2·2·(attention 3·2048 + (64+8)·128 = 15,360
  + MoE 3·2048 + 4·128 + 8·(3·2048 + 3·768) = 74,240)                    = 358,400
  last stage per token: 24·2048·2 = 98,304 + logits 151936·8 = 1,215,488 = 1,313,792
  first stage per token: 2 · 98,304 + 358,400                            =   555,008
  at 65,536 tokens, the last stage: 91,689,844,736 + 65,536 · 1,313,792 = 177,790,517,248 B
  (165.6 GiB); longest that fits: (309,237,645,312 − 91,689,844,736) // 1,313,792 = 165,587
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentrl.api import AgentRLJob
from agentrl.cli import main
from agentrl.sim import architectures
from agentrl.sim.hardware import gpu_by_name
from agentrl.sim.memory import (
    CHECKPOINTS_KEPT,
    EXPORTS_KEPT,
    MemoryVerdict,
    check_trainer_memory,
    checkpoint_volume,
    estimate_trainer_memory,
)
from agentrl.sim.params import SimControl, SimParams
from agentrl.sim.plan import plan_job
from tests.factories import make_job

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
MI355X = {"amd.com/gpu.product-name": "AMD_Instinct_MI355X"}
QUICK = SimParams(sim=SimControl(warmup_seconds=300, measure_seconds=600, measure_steps=1,
                                  measure_steps_async=1))
FAST = ("sim:\n  warmup_seconds: 300\n  measure_seconds: 600\n  measure_steps: 1\n"
        "  measure_steps_async: 1\n")


def _dense(tokens: int, **trainer: object) -> AgentRLJob:
    return (make_job("dense", namespace=None)
            .with_model(source={"path": "Qwen3-8B", "pvc": "models"}, architecture="Qwen3-8B")
            .with_inference(contextLength=max(tokens, 65536), nodeSelector=MI355X)
            .with_rollout(maxTrajectoryTokens=tokens)
            .with_trainer(nodes=1, gpusPerNode=8, trajectoriesPerStep=64, **trainer).obj())


def _report() -> AgentRLJob:
    path = next(p for p in EXAMPLES if p.name == "mi355x-report.yaml")
    return AgentRLJob.model_validate(yaml.safe_load(path.read_text()))


def test_dense_qwen3_8b_at_tensor_1_and_32k_tokens() -> None:
    est = estimate_trainer_memory(_dense(32768), architectures.builtin("Qwen3-8B"),
                                  gpu_by_name("MI355X"))
    (stage,) = est.stages
    assert stage.params == 8_190_427_136
    assert stage.fixed_bytes == 72_165_621_760
    assert stage.bytes_per_token == 1_510_400
    assert stage.layer_bytes_per_token == 286_720
    assert est.total_bytes == 121_658_408_960
    assert est.max_tokens == 156_959
    assert est.fits


def test_moe_qwen3_30b_a3b_at_the_reports_layout() -> None:
    job = _report()
    est = estimate_trainer_memory(job, architectures.builtin("Qwen3-30B-A3B"),
                                  gpu_by_name("MI355X"))
    first, last = est.stages
    assert (first.stage, last.stage) == ("first", "last")
    assert first.params == last.params == 4_394_319_872
    assert last.fixed_bytes == 91_689_844_736
    assert last.layer_bytes_per_token == 358_400
    assert last.bytes_per_token == 1_313_792
    assert first.bytes_per_token == 555_008
    assert first.micro_batches_in_flight == 2
    assert est.worst.stage == "last"
    assert est.total_bytes == 177_790_517_248
    assert est.max_tokens == 165_587
    assert est.data_parallel == 4


def _validate(tmp_path: Path, job: AgentRLJob) -> tuple[int, str, Path]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True,
                                                  exclude_none=True)))
    result = CliRunner().invoke(main, ["validate", str(path)])
    return result.exit_code, result.output, path


def test_validate_refuses_a_trajectory_length_the_trainer_cannot_hold(tmp_path: Path) -> None:
    # 262,144 tokens: 72,165,621,760 + 262,144 · 1,510,400 = 468,109,148,160 B (436.0 GiB) of
    # the 288 GiB; the logits alone are 262,144 · 1,215,488 B = 296.75 GiB (printed 296.8).
    code, output, path = _validate(tmp_path, _dense(262144))
    assert code == 1
    assert f"{path}: spec.rollout.maxTrajectoryTokens: 262144 tokens need ~436.0 GiB" in output
    assert "296.8 GiB fp32 logits" in output
    assert "288.0 GiB of one MI355X" in output
    assert "at most 156959" in output
    assert "spec.trainer.parallelism.tensor" in output


def test_raising_tensor_parallelism_as_the_message_says_makes_it_fit(tmp_path: Path) -> None:
    # Tensor 4: params 8,190,427,136 / 4 = 2,047,606,784 per GPU, 2 data-parallel ranks;
    # fixed 4,095,213,568 + 8,190,427,136 + 12,285,640,704 + 10,737,418,240 = 35,308,699,648;
    # per token 294,912 + 37,984 · 8 = 598,784 → 35,308,699,648 + 262,144 · 598,784
    # = 192,276,332,544 B (179.1 GiB), within 288 GiB.
    job = _dense(262144, parallelism={"tensor": 4})
    check = check_trainer_memory(job)
    assert check.verdict == MemoryVerdict.FITS
    assert check.estimate is not None and check.estimate.total_bytes == 192_276_332_544
    code, output, _ = _validate(tmp_path, job)
    assert code == 0, output


def test_a_model_whose_state_alone_does_not_fit_names_the_parallel_layout(
    tmp_path: Path,
) -> None:
    # Qwen3-235B-A22B on one 8-GPU node at tensor 1, expert 1: ~235e9 parameters × 6 B of
    # weights and gradients alone is ~1.4 TB per GPU.
    job = (make_job("big", namespace=None)
           .with_model(architecture="Qwen3-235B-A22B")
           .with_inference(nodeSelector=MI355X)
           .with_trainer(nodes=1, gpusPerNode=8).obj())
    code, output, path = _validate(tmp_path, job)
    assert code == 1
    assert f"{path}: spec.trainer.parallelism: " in output
    assert "leaving no room for a trajectory" in output


def test_an_unknown_model_is_not_estimated_and_validate_says_so(tmp_path: Path) -> None:
    job = make_job("mystery", namespace=None).with_model_path("/opt/mystery-model").obj()
    check = check_trainer_memory(job)
    assert check.verdict == MemoryVerdict.NOT_ESTIMATED and check.estimate is None
    code, output, _ = _validate(tmp_path, job)
    assert code == 0, output
    assert "note: trainer memory not estimated" in output


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_shipped_example_passes_validate(path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_plan_reports_the_trainer_memory_in_text_and_json(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(FAST)
    manifest = next(p for p in EXAMPLES if p.name == "mi355x-report.yaml")
    result = CliRunner().invoke(main, ["plan", str(manifest), "--json", "--params", str(params)])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.output)["trainer_memory"]
    assert memory["verdict"] == "fits"
    assert memory["gib_per_gpu"] == 165.6  # 177,790,517,248 / 2^30
    assert memory["max_trajectory_tokens"] == 165_587
    assert memory["gpu"] == "MI355X"
    text = CliRunner().invoke(main, ["plan", str(manifest), "--params", str(params)])
    assert text.exit_code == 0, text.output
    assert "trainer memory per GPU" in text.output
    assert "165.6 of 288 GiB" in text.output


def test_plan_warns_naming_the_field_when_the_trainer_cannot_fit(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(FAST)
    job = _dense(262144).model_dump(mode="json", by_alias=True, exclude_none=True)
    job["spec"]["sandbox"] = {"concurrency": 8}
    job["spec"]["rollout"]["maxTurns"] = 10
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(main, ["plan", str(path), "--json", "--params", str(params)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["trainer_memory"]["verdict"] == "too-large"
    assert out["trainer_memory"]["field"] == "spec.rollout.maxTrajectoryTokens"
    assert any(w.startswith("spec.rollout.maxTrajectoryTokens: 262144 tokens need")
               for w in out["warnings"])


def test_the_checkpoint_volume_of_the_report_example() -> None:
    # Qwen3-30B-A3B: 48 · (18,874,368 + 262,144 + 603,979,776) + 2 · 311,164,928
    # = 30,531,911,680 parameters; an export 2 B each = 61,063,823,360 B, a checkpoint 14 B each
    # = 427,446,763,520 B; steady 2 · 61,063,823,360 + 3 · 427,446,763,520 = 1,404,467,937,280;
    # peak 3 · 61,063,823,360 + 4 · 427,446,763,520 = 1,892,978,524,160 B, within 2Ti
    # (2,199,023,255,552 B).
    volume = checkpoint_volume(_report(), architectures.builtin("Qwen3-30B-A3B"))
    assert volume.export_bytes == 61_063_823_360
    assert volume.checkpoint_bytes == 427_446_763_520
    assert volume.steady_bytes == 1_404_467_937_280
    assert volume.peak_bytes == 1_892_978_524_160
    assert volume.size_bytes == 2_199_023_255_552
    assert volume.fits


def test_a_checkpoint_size_below_the_peak_is_a_plan_warning_naming_the_field() -> None:
    job = _report().model_dump(mode="json", by_alias=True, exclude_none=True)
    job["spec"]["trainer"]["checkpoint"]["size"] = "500Gi"  # 536.9 GB: not even 2 checkpoints
    plan = plan_job(AgentRLJob.model_validate(job), QUICK)
    (warning,) = [w for w in plan.warnings if w.startswith("trainer.checkpoint.size")]
    assert "(500Gi = 536.9 GB)" in warning
    assert "1,893.0 GB" in warning
    assert "at least 1763Gi" in warning  # ceil(1,892,978,524,160 / 2^30)


def test_the_kept_counts_are_the_trainers_defaults() -> None:
    from agentrl.trainer.checkpoint import CheckpointStore
    from agentrl.trainer.weight_sync import DiskWeightSync, DistributedWeightSync

    def default(fn: object, name: str) -> object:
        return inspect.signature(fn).parameters[name].default  # type: ignore[arg-type]

    assert default(CheckpointStore.__init__, "keep") == CHECKPOINTS_KEPT
    assert default(DiskWeightSync.__init__, "keep") == EXPORTS_KEPT
    assert default(DistributedWeightSync.__init__, "keep") == EXPORTS_KEPT
