"""The stop grace period, measured: seconds from SIGTERM to a consistent checkpoint on disk, as a
function of model size, on the torch backend (``spec.trainer.checkpoint.stopGracePeriodSeconds``).

    python bench/stop_grace.py [--sizes mini,small,10m,50m,200m] [--repeats 3] [--tokens 256]
        [--trajectories 4] [--dir DIR] [--pvc-gbps 1.0] [--raw-write-mb 2000] [--json]

For every size, a Qwen3 causal LM in HF format is made here (:func:`agentrl.trainer.hf_model.
create_model` with the shapes of :data:`SIZES`, random weights, the project's tokenizer) and
loaded into the torch backend as the trainer pod builds it (:func:`agentrl.trainer.factories.
torch_backend_for`). One GRPO step warms it up (the first step allocates the AdamW moments, so
every checkpoint after it has its full size), and one checkpoint of it is saved directly
(``direct_save_s``: :meth:`CheckpointStore.save` alone). Then, ``--repeats`` times, two stops,
each on the real path: a :class:`~agentrl.trainer.loop.TrainingDriver` over a real
:class:`~agentrl.rollout.scheduler.RolloutScheduler` (episodes that finish at once with
random tokens of the model's vocabulary, ``--trajectories`` per step, ``--tokens`` each, the
second half generated), the disk weight sync with no engine (:class:`DiskWeightSync`: the
export and the pointer file of every step, as the trainer writes them, without an engine's
reload), a :class:`~agentrl.trainer.checkpoint.CheckpointStore` and a
:class:`~agentrl.trainer.stopping.StopRequest` bound to this process's SIGTERM by
:func:`~agentrl.trainer.stopping.on_stop_signals`, as in the trainer pod. The signal is a real
one, ``os.kill(os.getpid(), SIGTERM)``:

* ``between_steps``: the driver has finished a step and waits for trajectories that never
  come; the wait is abandoned and the step is checkpointed (checkpoint only);
* ``mid_step``: the signal is sent as the backend's ``train_step`` starts (the worst moment):
  the driver finishes the step (an update that has started is never cut), pushes its weights
  (the export), then checkpoints it.

The volume is in steady state before each stop, as a trainer's is after a few intervals: three
checkpoints are already there (the oldest a full copy of the direct save, which the new
checkpoint deletes, as :class:`CheckpointStore` keeps three) and two weight exports (the
older a full copy, which the step's push deletes). Everything is flushed (``os.sync``) before
the signal.

Per stop: ``signal_to_checkpoint_s``, from the signal to :meth:`CheckpointStore.save`
returning (the checkpoint renamed into place: complete and consistent in the file system, its
data possibly still in the page cache, which survives the SIGKILL at the end of the grace
period); ``fsync_s``, then every file of it and its directory fsynced (the bytes on the
device, what a node crash would keep; what a network volume's close-to-open semantics cost
already at ``close``); ``signal_to_durable_s``, their sum; ``signal_to_exit_s``, until
``driver.run()`` returned; ``checkpoint_bytes``, the files of the new checkpoint directory.
Mid-step also: ``step_s`` (the backend's ``train_step``), ``push_s`` (the export), and
``checkpoint_after_step_s`` (from the step's record to the checkpoint). Medians over the
repeats per size; every run is listed under ``runs``.

``fit``: a least-squares line of ``signal_to_durable_s`` (between steps) over checkpoint GB
across the sizes: ``seconds_per_gb`` on this machine's disk for the torch backend's
checkpoint (safetensors weights + ``torch.save`` of the optimizer state) and
``intercept_s``, the fixed cost of a stop. ``projection``: the grace period
:func:`grace_seconds` gives the job examples the product targets, with their step (log-prob
recomputation + actor update + weight sync, from ``agentrl plan``'s simulation) and their
checkpoint (14 bytes per parameter, the planner's megatron figure), at ``--pvc-gbps`` (the
assumed write throughput of the cluster's checkpoint volume) and at this disk's measured
throughput. ``machine.disk_write_gbps``: the disk's own rate (``--raw-write-mb`` of random
bytes written and fsynced), to tell the disk from the serialization in ``seconds_per_gb``. The
figures are the bench's output; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer import hf_model
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.checkpoint import DRIVER_FILE, CheckpointStore, DriverState
from agentrl.trainer.hf_model import ModelPreset
from agentrl.trainer.loop import StepRecord, TaskOrder, TaskStream, TrainingDriver
from agentrl.trainer.stats import StepStats
from agentrl.trainer.stopping import StopRequest, on_stop_signals
from agentrl.trainer.weight_sync import DiskWeightSync

#: Model shapes of the sweep (Qwen3; the project's 739-token vocabulary, tied embeddings), by
#: their approximate parameter count; ``mini`` and ``small`` are ``agentrl model create``'s.
SIZES: dict[str, ModelPreset] = {
    "mini": hf_model.PRESETS["mini"],
    "small": hf_model.PRESETS["small"],
    "10m": ModelPreset(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "50m": ModelPreset(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
    "200m": ModelPreset(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
    ),
    "400m": ModelPreset(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
    ),
}
DEFAULT_SIZES = "mini,small,10m,50m,200m"
#: Checkpoint step of the volume before each stop (three checkpoints kept: S-2, S-1, S).
START_STEP = 10
GROUP_SIZE = 2
#: The grace period's margin over one step plus one checkpoint: this share of them, at least
#: :data:`MARGIN_MIN_S` (the pod's exit, the progress report, Ray's shutdown, a slower write).
MARGIN_FRACTION = 0.1
MARGIN_MIN_S = 60.0
#: The job examples the product targets, projected in ``projection``.
TARGETS = ("examples/small-cluster.yaml", "examples/mi355x-report.yaml")


def grace_seconds(step_s: float, checkpoint_bytes: float, write_gbps: float) -> int:
    """The grace period one stop needs: one step (log-prob recomputation, actor update, weight
    push: a stop that lands as an update starts waits for all of it) plus one checkpoint
    written at ``write_gbps`` GB/s, plus a margin of :data:`MARGIN_FRACTION` of them (at
    least :data:`MARGIN_MIN_S`), rounded up to a whole minute."""
    work = step_s + checkpoint_bytes / 1e9 / write_gbps
    total = work + max(MARGIN_MIN_S, MARGIN_FRACTION * work)
    return int(math.ceil(total / 60.0) * 60)


# -- the parts of one stop ----------------------------------------------------------------------


def job_spec(model_dir: Path, *, trajectories: int) -> AgentRLJobSpec:
    """A job on ``model_dir`` with the torch backend on the CPU: ``trajectories`` per step in
    groups of :data:`GROUP_SIZE`, weights pushed every step (disk), a checkpoint every 1,000
    steps (none but the stop's here), ``maxStaleness`` 1."""
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": str(model_dir)}},
            "dataset": {"format": "toy"},
            "rollout": {"groupSize": GROUP_SIZE},
            "sandbox": {"provider": "local"},
            "trainer": {
                "backend": "torch",
                "gpusPerNode": 0,
                "trajectoriesPerStep": trajectories,
                "maxSteps": 100_000,
                "async": {"maxStaleness": 1},
                "checkpoint": {"intervalSteps": 1000},
                "weightSync": {"mode": "disk", "intervalSteps": 1},
            },
        }
    )


def make_trajectory(
    group_id: str, n: int, *, vocab: int, tokens: int, version: int, seed: int
) -> Trajectory:
    """Episode ``n``: ``tokens`` random token ids, the second half generated (engine logprobs
    near a uniform policy's), reward 1 for even ``n``, 0 for odd: every group of two carries
    signal."""
    rng = random.Random(f"{seed}:{n}")
    half = tokens // 2
    generated = [-math.log(vocab) + rng.gauss(0, 0.05) for _ in range(tokens - half)]
    return Trajectory(
        episode_id=f"{group_id}-{n}",
        task_id=group_id.split("#")[0],
        group_id=group_id,
        policy_version=version,
        terminal_class=TerminalClass.COMPLETED,
        reward=float(n % 2 == 0),
        training_action=ClassAction.TRAIN,
        token_ids=[rng.randrange(vocab) for _ in range(tokens)],
        logprobs=[0.0] * half + generated,
        loss_mask=[0] * half + [1] * (tokens - half),
    )


class Episodes:
    """The scheduler's runner: the first ``finish`` episodes end at once, every later one never
    (episodes in flight when the stop comes, which the checkpoint records as pending)."""

    def __init__(self, *, vocab: int, tokens: int, finish: int, seed: int) -> None:
        self.vocab, self.tokens, self.finish, self.seed = vocab, tokens, finish, seed
        self.started = 0

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        n = self.started
        self.started += 1
        if n >= self.finish:
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        return make_trajectory(
            group_id, n, vocab=self.vocab, tokens=self.tokens, version=policy_version,
            seed=self.seed,
        )  # fmt: skip


class SignalledBackend:
    """The torch backend, timed; ``signal_in_step``: the next ``train_step`` sends this process
    SIGTERM as it starts (the time is ``signalled_at``)."""

    def __init__(self, backend: Any, *, signal_in_step: bool) -> None:
        self.backend = backend
        self.signal_in_step = signal_in_step
        self.signalled_at: float | None = None
        self.step_seconds: list[float] = []

    def train_step(self, samples: Sequence[TrainSample]) -> StepStats:
        if self.signal_in_step:
            self.signal_in_step = False
            self.signalled_at = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)
        start = time.monotonic()
        stats: StepStats = self.backend.train_step(samples)
        self.step_seconds.append(time.monotonic() - start)
        return stats

    def save_state(self, directory: Path) -> None:
        self.backend.save_state(directory)

    def load_state(self, directory: Path) -> None:
        self.backend.load_state(directory)


class TimedStore(CheckpointStore):
    """The checkpoint store, noting when each save returned and what it wrote."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.saved: list[tuple[float, Path]] = []

    def save(self, backend: Any, state: DriverState) -> Path:
        path = super().save(backend, state)
        self.saved.append((time.monotonic(), path))
        return path


def tree_bytes(directory: Path) -> int:
    """Bytes of every file under ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def fsync_tree(directory: Path) -> float:
    """fsync every file under ``directory``, then the directories; returns the seconds."""
    start = time.monotonic()
    paths = sorted(directory.rglob("*"))
    files = [p for p in paths if p.is_file()]
    dirs = [p for p in paths if p.is_dir()]
    for path in [*files, *dirs, directory, directory.parent]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.monotonic() - start


def steady_volume(root: Path, template: Path) -> None:
    """``root`` as a trainer's volume at step :data:`START_STEP`: checkpoints S-2 (a full copy
    of ``template``, deleted by the next save), S-1 and S (their ``driver.json`` only: kept),
    and weight exports v(S-1) (a full copy, deleted by the next push) and v(S)."""
    s = START_STEP
    shutil.copytree(template, root / f"step-{s - 2:08d}")
    for step in (s - 1, s):
        (root / f"step-{step:08d}").mkdir()
        shutil.copyfile(template / DRIVER_FILE, root / f"step-{step:08d}" / DRIVER_FILE)
    shutil.copytree(template / "model", root / f"v{s - 1}")
    (root / f"v{s}").mkdir()
    os.sync()


async def one_stop(
    backend: Any,
    spec: AgentRLJobSpec,
    root: Path,
    *,
    mid_step: bool,
    vocab: int,
    tokens: int,
    seed: int,
    timeout: float,
) -> dict[str, Any]:
    """One stop on the real path (see the module docstring); the figures of it."""
    trainer = spec.trainer
    per_step = trainer.trajectories_per_step
    stream = TaskStream(TaskOrder(generate_toy_tasks(0), seed), cursor=0, pending=[])
    admission = StalenessAdmission(
        trajectories_per_step=per_step, max_staleness=trainer.async_.max_staleness,
        group_size=GROUP_SIZE,
    )  # fmt: skip
    admission.resume_at(START_STEP)
    scheduler = RolloutScheduler(
        runner=Episodes(vocab=vocab, tokens=tokens, finish=per_step, seed=seed),
        tasks=stream, admission=admission, concurrency=2 * per_step, group_size=GROUP_SIZE,
    )  # fmt: skip
    signalled = SignalledBackend(backend, signal_in_step=mid_step)
    store = TimedStore(root)
    stepped = asyncio.Event()
    records: list[tuple[float, StepRecord]] = []

    def on_step(record: StepRecord) -> None:
        records.append((time.monotonic(), record))
        stepped.set()

    stop = StopRequest()
    driver = TrainingDriver(
        spec=spec, backend=signalled, source=scheduler, admission=admission,
        weight_sync=DiskWeightSync(
            [], export=backend.export_weights, weights_dir=root, initial_version=START_STEP
        ),
        checkpoints=store, stream=stream, state=DriverState(step=START_STEP), on_step=on_step,
        stop=stop,
    )  # fmt: skip
    signalled_at: float | None = None

    async def signal_between_steps() -> None:
        nonlocal signalled_at
        await stepped.wait()
        await asyncio.sleep(0.5)  # the driver is back waiting for trajectories
        signalled_at = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)

    sender = None if mid_step else asyncio.create_task(signal_between_steps())
    try:
        with on_stop_signals(stop) as installed:
            if not installed:
                raise RuntimeError("the stop signal handlers need the main thread")
            await asyncio.wait_for(driver.run(), timeout=timeout)
        returned = time.monotonic()
    finally:
        await scheduler.cancel()
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    if mid_step:
        signalled_at = signalled.signalled_at
    assert signalled_at is not None and stop.reason == "SIGTERM"
    saved_at, path = store.saved[-1]
    fsync_s = fsync_tree(path)
    (step_at, record), *_ = [r for r in records if not mid_step or r[1].step == START_STEP + 1]
    out: dict[str, Any] = {
        "checkpoint": path.name,
        "checkpoint_bytes": tree_bytes(path),
        "signal_to_checkpoint_s": saved_at - signalled_at,
        "fsync_s": fsync_s,
        "signal_to_durable_s": saved_at - signalled_at + fsync_s,
        "signal_to_exit_s": returned - signalled_at,
        "checkpoints_kept": store.steps(),
        "exports_kept": sorted(p.name for p in root.glob("v*")),
        "pending_tasks": len(driver.state.pending_positions),
        "step_s": signalled.step_seconds[-1],
        "push_s": record.times.weight_sync,
    }
    if mid_step:
        out["checkpoint_after_step_s"] = saved_at - step_at
    return out


# -- one size -----------------------------------------------------------------------------------


def warm_up(backend: Any, *, vocab: int, tokens: int, trajectories: int) -> float:
    """One GRPO step outside the driver (the first allocates the AdamW moments); seconds."""
    samples = [
        TrainSample(
            trajectory=make_trajectory("warm#0", n, vocab=vocab, tokens=tokens, version=0, seed=-1),
            advantage=1.0 if n % 2 == 0 else -1.0,
            carries_loss=True,
        )
        for n in range(trajectories)
    ]
    start = time.monotonic()
    backend.train_step(samples)
    return time.monotonic() - start


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def measure_size(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from agentrl.trainer.factories import torch_backend_for

    shape = SIZES[name]
    started = time.monotonic()
    model_dir = hf_model.create_model(work / f"model-{name}", seed=0, preset=shape)
    spec = job_spec(model_dir, trajectories=args.trajectories)
    backend = torch_backend_for(spec, model_dir, seed=0)
    vocab = int(backend.model.config.vocab_size)
    made_s = time.monotonic() - started
    warm_s = warm_up(backend, vocab=vocab, tokens=args.tokens, trajectories=args.trajectories)
    template_store = CheckpointStore(work / f"template-{name}")
    os.sync()
    start = time.monotonic()
    template = template_store.save(backend, DriverState(step=START_STEP))
    direct_save_s = time.monotonic() - start
    direct_fsync_s = fsync_tree(template)
    runs: dict[str, list[dict[str, Any]]] = {"between_steps": [], "mid_step": []}
    for repeat in range(args.repeats):
        for case in ("between_steps", "mid_step"):
            root = work / f"volume-{name}-{case}-{repeat}"
            root.mkdir()
            steady_volume(root, template)
            run = asyncio.run(
                one_stop(
                    backend, spec, root, mid_step=case == "mid_step", vocab=vocab,
                    tokens=args.tokens, seed=repeat, timeout=args.timeout,
                )
            )  # fmt: skip
            if args.keep_dir is None:
                shutil.rmtree(root)
            runs[case].append(run)
    params = int(backend.model.num_parameters())
    checkpoint_bytes = runs["between_steps"][0]["checkpoint_bytes"]
    result: dict[str, Any] = {
        "size": name,
        "parameters": params,
        "shape": shape.model_dump(),
        "vocab_size": vocab,
        "checkpoint_bytes": checkpoint_bytes,
        "bytes_per_parameter": round(checkpoint_bytes / params, 3),
        "model_build_s": made_s,
        "warm_up_step_s": warm_s,
        "direct_save_s": direct_save_s,
        "direct_save_fsync_s": direct_fsync_s,
    }
    for case, case_runs in runs.items():
        keys = ["signal_to_checkpoint_s", "fsync_s", "signal_to_durable_s", "signal_to_exit_s",
                "step_s", "push_s"]  # fmt: skip
        if case == "mid_step":
            keys.append("checkpoint_after_step_s")
        result[case] = {key: _median(case_runs, key) for key in keys} | {"runs": case_runs}
    del backend
    if args.keep_dir is None:
        shutil.rmtree(work / f"template-{name}")
        shutil.rmtree(model_dir)
    return result


# -- what it means ------------------------------------------------------------------------------


def fit(sizes: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    """Least squares of ``between_steps[key]`` over checkpoint GB: intercept and s/GB."""
    points = [(s["checkpoint_bytes"] / 1e9, s["between_steps"][key]) for s in sizes]
    if len({x for x, _ in points}) < 2:
        return None
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return {
        "intercept_s": intercept,
        "seconds_per_gb": slope,
        "gb_per_s": 1 / slope if slope > 0 else math.inf,
    }


def projection(write_gbps: float, local_gbps: float | None) -> list[dict[str, Any]]:
    """The grace period of :data:`TARGETS` (``agentrl plan``'s step and checkpoint figures) at
    ``write_gbps`` and at this disk's measured throughput."""
    from agentrl.api.validation import load_job
    from agentrl.sim.plan import plan_job

    root = Path(__file__).resolve().parents[1]
    out = []
    for example in TARGETS:
        job = load_job((root / example).read_text(encoding="utf-8"))
        plan = plan_job(job)
        breakdown = plan.simulation.step_breakdown
        assert breakdown is not None and plan.checkpoint_volume is not None
        step = breakdown.logprob_recompute + breakdown.actor_update + breakdown.weight_sync
        ckpt = plan.checkpoint_volume.checkpoint_bytes
        row: dict[str, Any] = {
            "example": example,
            "model": plan.static.architecture,
            "parameters": plan.static.total_params,
            "step_s": round(step, 1),
            "step_parts_s": {
                "logprob_recompute": round(breakdown.logprob_recompute, 1),
                "actor_update": round(breakdown.actor_update, 1),
                "weight_sync": round(breakdown.weight_sync, 1),
            },
            "checkpoint_bytes": ckpt,
            "assumed_write_gbps": write_gbps,
            "checkpoint_write_s": round(ckpt / 1e9 / write_gbps, 1),
            "grace_s": grace_seconds(step, ckpt, write_gbps),
            "grace_s_at_local_disk": (
                grace_seconds(step, ckpt, local_gbps) if local_gbps else None
            ),
            "set": job.spec.trainer.checkpoint.stop_grace_period_seconds,
        }
        out.append(row)
    return out


def disk_write_gbps(directory: Path, megabytes: int) -> float | None:
    """The disk's own rate: ``megabytes`` MB written in 16 MB blocks and fsynced, GB/s (what a
    checkpoint would reach with no serialization in the way); None for 0 MB."""
    if megabytes <= 0:
        return None
    block = os.urandom(16_000_000)
    path = directory / "raw-write"
    os.sync()
    start = time.monotonic()
    with path.open("wb") as fh:
        for _ in range(max(1, megabytes // 16)):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.monotonic() - start
    written = path.stat().st_size
    path.unlink()
    return written / 1e9 / seconds


def machine(directory: Path, raw_write_mb: int) -> dict[str, Any]:
    import torch

    load = os.getloadavg()
    fs, longest = "?", -1
    with contextlib.suppress(OSError):  # the mount the directory is on: the longest prefix
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mount, kind, *_ = line.split()
            inside = directory.resolve().is_relative_to(mount)
            if inside and len(mount) > longest:
                fs, longest = f"{dev} {kind} on {mount}", len(mount)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "checkpoint_dir_fs": fs,
        "disk_write_gbps": disk_write_gbps(directory, raw_write_mb),
        "load_1m_at_start": load[0],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"comma-separated, of {', '.join(SIZES)} (default {DEFAULT_SIZES})",
    )
    parser.add_argument("--repeats", type=int, default=3, help="stops per size and case")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per trajectory")
    parser.add_argument("--trajectories", type=int, default=4, help="trajectories per step")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where checkpoints go (default: a temporary "
        "directory under $TMPDIR; its disk is the one measured)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-dir", type=Path, default=None, help=argparse.SUPPRESS
    )  # keep every file (the tests read them)
    parser.add_argument(
        "--pvc-gbps", type=float, default=1.0,
        help="assumed write throughput of the cluster's checkpoint volume (GB/s) for the "
        "projection",
    )  # fmt: skip
    parser.add_argument(
        "--no-projection", action="store_true", help="leave out the projection (agentrl plan)"
    )
    parser.add_argument(
        "--raw-write-mb", type=int, default=2000,
        help="MB written and fsynced to measure the disk's own rate (0: not measured)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per stop, at most")
    parser.add_argument("--json", action="store_true", help="one JSON object (the default too)")
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown or not args.sizes:
        parser.error(f"--sizes: unknown {unknown}; known: {', '.join(SIZES)}")
    if args.repeats < 1 or args.trajectories < GROUP_SIZE or args.trajectories % GROUP_SIZE:
        parser.error(f"--repeats ≥ 1 and --trajectories a multiple of {GROUP_SIZE}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" at every save
    base = args.keep_dir or args.dir
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stop-grace-", dir=base))
    started = time.monotonic()
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": machine(work, args.raw_write_mb),
        "tokens_per_trajectory": args.tokens,
        "trajectories_per_step": args.trajectories,
        "repeats": args.repeats,
    }
    try:
        sizes = [measure_size(name, args, work) for name in args.sizes]
    finally:
        if args.keep_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["sizes"] = sizes
    result["fit"] = {
        "durable": fit(sizes, "signal_to_durable_s"),
        "page_cache": fit(sizes, "signal_to_checkpoint_s"),
    }
    durable = result["fit"]["durable"]
    local = durable["gb_per_s"] if durable is not None else None
    result["margin"] = {"fraction": MARGIN_FRACTION, "min_s": MARGIN_MIN_S}
    result["projection"] = [] if args.no_projection else projection(args.pvc_gbps, local)
    result["load_1m_at_end"] = os.getloadavg()[0]
    result["seconds"] = round(time.monotonic() - started, 1)
    if args.keep_dir is not None:
        result["work_dir"] = str(work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
