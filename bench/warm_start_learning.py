"""The three-point claim of the real-model path: held-out pass@1 of the HF-format model made here,
base → after the SFT warm start → after GRPO, on the toy tasks, one run per seed.

    python bench/warm_start_learning.py [--manifest examples/quickstart-hf.yaml]
        [--seeds 0 1 2] [--preset mini] [--epochs N] [--max-steps N]

For each seed it does what the manifest's header tells a user to do: ``agentrl model create``
(that seed's random weights), ``agentrl tasks traces`` (expert conversations of the training
split), then runs the manifest as ``agentrl run`` does (same engines, rollout, trainer; no Ray),
with the model and the traces in a scratch directory. It prints one JSON line per seed (the
three points, the warm start's first and last loss, wall seconds of each part) and whether the
issue's goal holds: after SFT ≥ base + 20 points and after RL ≥ after SFT + 10 points. The
claim is measured, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agentrl.local.report import write_report
from agentrl.local.runner import RunOptions, run_local
from agentrl.trainer import hf_model


def _job(manifest: Path, model: Path, traces: Path, args: argparse.Namespace) -> Any:
    from agentrl.api.validation import load_job

    doc = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    spec = doc["spec"]
    spec["model"]["source"]["path"] = str(model)
    warm = spec["trainer"]["warmStart"]
    warm["dataset"] = str(traces)
    if args.epochs is not None:
        warm["epochs"] = args.epochs
    return load_job(yaml.safe_dump(doc))


def run_seed(seed: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    started = time.monotonic()
    model = hf_model.create_model(scratch / "model", preset=args.preset, seed=seed)
    made = time.monotonic()
    traces = scratch / "traces.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "tasks",
            "traces",
            str(args.manifest),
            "--out",
            str(traces),
        ],
        check=True,
    )
    traced = time.monotonic()
    job = _job(args.manifest, model, traces, args)

    def phase(name: str) -> None:
        print(f"  [seed {seed} {time.monotonic() - started:6.0f}s] {name}", flush=True)

    result = asyncio.run(
        run_local(
            job,
            RunOptions(run_dir=scratch / "run", max_steps=args.max_steps, seed=seed),
            on_phase=phase,
            on_step=lambda r: phase(f"step {r.step} reward {r.reward_mean:.2f}"),
        )
    )
    summary = write_report(result, scratch / "run" / "report")
    warm = summary["warm_start"] or {}
    return {
        "seed": seed,
        "base": summary["pass_at_1_before"],
        "after_warm_start": summary["pass_at_1_after_warm_start"],
        "after_rl": summary["pass_at_1_after"],
        "warm_start_loss_first": warm.get("loss_first"),
        "warm_start_loss_last": warm.get("loss_last"),
        "warm_start_updates": warm.get("updates"),
        "rl_steps": summary["steps"],
        "classes": summary["classes"],
        "seconds": {
            "model": round(made - started, 1),
            "traces": round(traced - made, 1),
            "run": round(summary["wall_seconds"], 1),
            "training": round(summary["training_seconds"], 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, default=Path("examples/quickstart-hf.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--preset", default="mini", choices=sorted(hf_model.PRESETS))
    parser.add_argument("--epochs", type=int, default=None, help="override warmStart.epochs")
    parser.add_argument("--max-steps", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"agentrl-warm-{seed}-") as scratch:
            row = run_seed(seed, args, Path(scratch))
        print(json.dumps(row, sort_keys=True), flush=True)
        rows.append(row)
    for row in rows:
        base, sft, rl = row["base"], row["after_warm_start"], row["after_rl"]
        holds = None not in (base, sft, rl) and sft >= base + 0.20 and rl >= sft + 0.10
        print(
            f"seed {row['seed']}: pass@1 {base} → {sft} → {rl}  "
            f"(SFT loss {row['warm_start_loss_first']:.3f} → {row['warm_start_loss_last']:.3f}; "
            f"run {row['seconds']['run']:.0f}s)  goal: {'HOLDS' if holds else 'NOT MET'}"
        )


if __name__ == "__main__":
    main()
