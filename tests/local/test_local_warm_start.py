"""``agentrl run`` on the real-model path: the HF-format model made here served by the CPU engine,
the native tool-call agent, the warm start on expert traces written by ``agentrl tasks traces``,
then a GRPO step, with held-out pass@1 at the three points (base, after the warm start, after
RL) in ``evaluations.jsonl`` and ``summary.json``.

Independent checks: the stages and steps of the evaluations as the run order implies them; the
weights the engine served after the warm start are the warm-started ones (their logprobs of a
trace differ from the base model's, and equal those of the checkpoint the stage wrote); the
number of warm-start updates from the batch budget (each trace is longer than half a batch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from agentrl.cli import main
from agentrl.trainer import hf_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-hf.yaml"


@pytest.mark.slow
def test_agentrl_run_warms_the_hf_model_up_then_trains_it_with_three_evaluations(
    tmp_path: Path,
) -> None:
    model = hf_model.create_model(tmp_path / "model", seed=0)
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    spec["model"]["source"]["path"] = str(model)
    spec["dataset"].update({"maxTasks": 8, "heldOutFraction": 0.5})
    spec["rollout"].update({"groupSize": 2, "maxTurns": 6})
    spec["trainer"].update(
        {
            "trajectoriesPerStep": 4,
            "maxSteps": 1,
            "evaluation": {"tasks": 2, "attemptsPerTask": 1},
        }
    )
    spec["trainer"]["warmStart"].update(
        {"dataset": str(tmp_path / "traces.jsonl"), "epochs": 2, "tokensPerBatch": 4096}
    )
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc))

    traced = CliRunner().invoke(
        main, ["tasks", "traces", str(manifest), "--out", str(tmp_path / "traces.jsonl")]
    )
    assert traced.exit_code == 0, traced.output
    assert "wrote 4 conversations" in traced.output  # the 4 training tasks of 8

    run_dir, report = tmp_path / "run", tmp_path / "report"
    result = CliRunner().invoke(
        main,
        ["run", str(manifest), "--quiet", "--no-ray", "--run-dir", str(run_dir),
         "--report", str(report)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    logs = run_dir / "logs"
    evaluations = [json.loads(x) for x in (logs / "evaluations.jsonl").read_text().splitlines()]
    assert [(e["stage"], e["step"]) for e in evaluations] == [
        ("base", 0),
        ("warm_start", 0),
        ("rl", 1),
    ]
    assert [e["weight_versions"] for e in evaluations] == [["0"], ["0"], ["1"]]
    updates = [json.loads(x) for x in (logs / "warm_start.jsonl").read_text().splitlines()]
    assert [u["update"] for u in updates] == list(range(1, 9))  # 4 traces × 2 epochs
    assert updates[-1]["loss"] < updates[0]["loss"]
    steps = [json.loads(x) for x in (logs / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1]

    summary = json.loads((report / "summary.json").read_text())
    assert summary["pass_at_1_before"] == evaluations[0]["pass_at_1"]
    assert summary["pass_at_1_after_warm_start"] == evaluations[1]["pass_at_1"]
    assert summary["pass_at_1_after"] == evaluations[2]["pass_at_1"]
    assert summary["warm_start"]["done"] is True and summary["warm_start"]["updates"] == 8
    assert summary["warm_start"]["loss_last"] == updates[-1]["loss"]

    # the engines' restart weights are the warm-started ones, as the stage's last checkpoint has
    # them, and not the model as made
    served = hf_model.load_causal_lm(run_dir / "weights" / "start-0")
    base = hf_model.load_causal_lm(model)
    ids = torch.tensor([list(range(5, 60))])
    with torch.no_grad():
        assert not torch.allclose(served(ids).logits, base(ids).logits)
    checkpoint = json.loads((run_dir / "checkpoints" / "step-00000000" / "driver.json").read_text())
    assert checkpoint["warm_start"]["done"] is True
    warm = hf_model.load_causal_lm(run_dir / "checkpoints" / "step-00000000" / "model")
    with torch.no_grad():
        assert torch.equal(served(ids).logits, warm(ids).logits)
