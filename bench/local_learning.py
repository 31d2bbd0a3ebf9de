"""The learning claim of ``agentrl run``: held-out pass@1 before and after training the tiny
policy on the toy dataset, measured in one run on this machine.

    python bench/local_learning.py [--manifest examples/quickstart.yaml] [--max-steps N]

It runs the manifest exactly as ``agentrl run`` does (same engines, rollout, trainer; no Ray, to
keep the 2-core budget for the work itself), writes the report next to the run, and prints the
before/after pass@1, their ratio and difference, the wall time, and whether the claim holds:
pass@1 at least doubles and rises by at least 20 points. The claim is *measured*, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path

from agentrl.local.report import write_report
from agentrl.local.runner import RunOptions, load_manifest, run_local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, default=Path("examples/quickstart.yaml"))
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    job = load_manifest(args.manifest)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    started = time.monotonic()

    def on_step(r: object) -> None:
        print(
            f"step {r.step:3d}  t={r.wall_seconds:6.0f}s  reward={r.reward_mean:.2f}  "  # type: ignore[attr-defined]
            f"pass={r.pass_rate:.2f}  classes={r.classes}",  # type: ignore[attr-defined]
            flush=True,
        )

    result = asyncio.run(
        run_local(
            job,
            RunOptions(
                run_dir=run_dir,
                max_steps=args.max_steps,
                eval_samples=args.eval_samples,
                seed=args.seed,
            ),
            on_step=on_step,
            on_phase=lambda p: print(f"[{time.monotonic() - started:6.0f}s] {p}", flush=True),
        )
    )
    summary = write_report(result, run_dir / "report")
    before, after = summary["pass_at_1_before"], summary["pass_at_1_after"]
    ratio = after / before if before else float("inf")
    points = 100 * (after - before)
    print(json.dumps(summary, indent=2, sort_keys=True))
    print(
        f"\nheld-out pass@1: before {before:.3f}  after {after:.3f}  ratio {ratio:.2f}x  "
        f"gain {points:+.1f} points  ({summary['held_out_tasks']} tasks × {args.eval_samples})"
    )
    print(
        f"steps {summary['steps']}  training {summary['training_seconds']:.0f}s  "
        f"wall {time.monotonic() - started:.0f}s  report {run_dir / 'report'}"
    )
    print("claim (≥2x and ≥+20 points):", "HOLDS" if ratio >= 2 and points >= 20 else "NOT MET")


if __name__ == "__main__":
    main()
