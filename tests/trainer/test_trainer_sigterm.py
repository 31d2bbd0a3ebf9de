"""The trainer pod's entry point under SIGTERM, as Kubernetes sends it (suspend, drain, pod
deletion): ``agentrl trainer --no-ray`` against a real tiny engine finishes its step, checkpoints
it, exits 143; started again, it continues at the next step — no step repeated, none lost.
Under Ray, pod 0's main process hands the signal to the driver actor, which does the same."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api.validation import load_job
from agentrl.api.wire import CONFIG_RUNTIME_KEY
from agentrl.reconcile import configmap
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.loop import StepRecord
from agentrl.trainer.stopping import STOPPED_EXIT_CODE
from tests.trainer.tiny_engine import tiny_engine

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job_and_runtime(policy: Path, url: str, max_steps: int) -> tuple[Any, Any, dict[str, Any]]:
    """The quickstart on ``policy`` served at ``url``: no checkpoint but the stop's (or the
    end's), no held-out evaluation. Returns the job, its runtime config and the manifest."""
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["model"]["source"]["path"] = str(policy)
    trainer = doc["spec"]["trainer"]
    trainer.update(maxSteps=max_steps, trajectoriesPerStep=8)
    trainer["checkpoint"] = {"intervalSteps": 1000}  # only the stop (or the end) writes one
    trainer["evaluation"] = {"tasks": 0}
    job = load_job(yaml.safe_dump(doc))
    runtime = configmap.runtime_config(job, BuildContext.for_job(job), workload_scale(job))
    runtime = runtime.model_copy(
        update={"engines": runtime.engines.model_copy(update={"urls": [url]})}
    )
    return job, runtime, doc


def _write_config(directory: Path, policy: Path, url: str, max_steps: int) -> Path:
    _, runtime, doc = _job_and_runtime(policy, url, max_steps)
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    (directory / CONFIG_RUNTIME_KEY).write_text(
        yaml.safe_dump(runtime.model_dump(mode="json", by_alias=True))
    )
    return spec


def _trainer(spec: Path, checkpoints: Path, log: Path) -> subprocess.Popen[str]:
    """``agentrl trainer --no-ray``, its log in ``log`` (a pipe nobody reads could fill)."""
    env: dict[str, Any] = {
        **os.environ,
        "AGENTRL_CONFIG": str(spec),
        "AGENTRL_CHECKPOINT_DIR": str(checkpoints),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "trainer", "--no-ray"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
    )


def _steps(checkpoints: Path) -> list[int]:
    log = checkpoints / "trainer" / "steps.jsonl"
    if not log.is_file():
        return []
    return [StepRecord.model_validate_json(line).step for line in log.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_checkpoints_the_last_step_exits_143_and_a_restart_continues_after_it(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "ckpt"
    with tiny_engine(tmp_path / "policy") as url:
        policy = tmp_path / "policy"
        spec = _write_config(tmp_path / "config", policy, url, max_steps=1000)
        log = tmp_path / "first.log"
        first = _trainer(spec, checkpoints, log)
        deadline = time.monotonic() + 300
        while len(_steps(checkpoints)) < 2:
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no two steps within 300 s"
            time.sleep(0.2)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
        err = log.read_text()
        assert first.returncode == STOPPED_EXIT_CODE, err[-3000:]
        done = _steps(checkpoints)
        # the last logged step (the one under way at the signal included) is the checkpoint
        assert CheckpointStore(checkpoints / "trainer").steps() == [done[-1]]
        saved = DriverState.model_validate_json(
            (checkpoints / "trainer" / f"step-{done[-1]:08d}" / "driver.json").read_text()
        )
        assert saved.step == done[-1] and saved.task_cursor > 0
        assert "stop requested (SIGTERM)" in err

        # resumed (the pod re-created on resume): the next steps, none repeated or lost
        spec = _write_config(tmp_path / "config", policy, url, max_steps=done[-1] + 2)
        log = tmp_path / "second.log"
        second = _trainer(spec, checkpoints, log)
        second.wait(timeout=300)
        err = log.read_text()
        assert second.returncode == 0, err[-3000:]
        assert _steps(checkpoints) == list(range(1, done[-1] + 3))
        assert f"resuming from the checkpoint of step {done[-1]}" in err


@pytest.fixture
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    from agentrl.ray_cluster import placement

    ray.init(
        num_cpus=4,
        resources={placement.TRAINER_NODE_RESOURCE: 8, placement.ROLLOUT_NODE_RESOURCE: 4},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_under_ray_sigterm_to_pod_0_reaches_the_driver_actor_which_checkpoints_and_stops(
    local_ray: None, tmp_path: Path
) -> None:
    # pod 0's main process runs run_placed; the driver is an actor in another process, which
    # the kubelet's SIGTERM never reaches: run_placed hands it over
    from agentrl.ray_cluster import placement
    from agentrl.trainer.config import TrainerConfig, TrainerEnv
    from agentrl.trainer.pod import run_placed

    checkpoints = tmp_path / "ckpt"
    with tiny_engine(tmp_path / "policy") as url:
        job, runtime, _ = _job_and_runtime(tmp_path / "policy", url, max_steps=1000)
        config = TrainerConfig(job=job, runtime=runtime, env=TrainerEnv(checkpoint_dir=checkpoints))

        def signal_after_the_first_step() -> None:
            deadline = time.monotonic() + 300
            while not _steps(checkpoints) and time.monotonic() < deadline:
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGTERM)

        placed = placement.place(placement.plan_placement(job), timeout_s=60, rollout=True)
        try:
            threading.Thread(target=signal_after_the_first_step, daemon=True).start()
            built = run_placed(config, placed)
        finally:
            placed.remove()
    assert (built.stopped, built.exit_code) == ("SIGTERM", STOPPED_EXIT_CODE)
    done = _steps(checkpoints)
    assert 1 <= done[-1] < 1000
    assert CheckpointStore(checkpoints / "trainer").steps() == [done[-1]]


EXAMPLE_HF = Path(__file__).parents[2] / "examples" / "quickstart-hf.yaml"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_in_the_warm_start_checkpoints_it_and_a_restart_finishes_it_then_trains(
    tmp_path: Path,
) -> None:
    """The trainer pod's warm start, in ``agentrl trainer --no-ray`` against a real CPU engine
    serving the HF model: SIGTERM in the middle of the stage checkpoints it (step 0) and exits
    143; the restarted pod resumes at the next update, never repeating one, pushes the
    warm-started weights and trains RL's first step."""
    from click.testing import CliRunner

    from agentrl.cli import main

    checkpoints = tmp_path / "ckpt"
    model = tmp_path / "model"
    with tiny_engine(model, hf_model=True) as url:
        doc = yaml.safe_load(EXAMPLE_HF.read_text())
        spec = doc["spec"]
        spec["model"]["source"]["path"] = str(model)
        spec["dataset"].update({"maxTasks": 8})
        spec["rollout"].update({"groupSize": 2, "maxTurns": 6})
        traces = tmp_path / "traces.jsonl"
        spec["trainer"].update(
            {
                "trajectoriesPerStep": 4,
                "maxSteps": 1,
                "evaluation": {"tasks": 0},
                "checkpoint": {"intervalSteps": 1000},  # only the stop and the epochs' ends
            }
        )
        spec["trainer"]["warmStart"].update(
            {"dataset": str(traces), "epochs": 6, "tokensPerBatch": 4096}
        )
        manifest = tmp_path / "job.yaml"
        manifest.write_text(yaml.safe_dump(doc))
        traced = CliRunner().invoke(main, ["tasks", "traces", str(manifest), "--out", str(traces)])
        assert traced.exit_code == 0, traced.output
        job = load_job(yaml.safe_dump(doc))
        runtime = configmap.runtime_config(job, BuildContext.for_job(job), workload_scale(job))
        runtime = runtime.model_copy(
            update={"engines": runtime.engines.model_copy(update={"urls": [url]})}
        )
        config = tmp_path / "config"
        config.mkdir()
        (config / "spec.yaml").write_text(yaml.safe_dump(doc))
        (config / CONFIG_RUNTIME_KEY).write_text(
            yaml.safe_dump(runtime.model_dump(mode="json", by_alias=True))
        )
        updates_log = checkpoints / "trainer" / "warm_start.jsonl"

        def updates() -> list[int]:
            if not updates_log.is_file():
                return []
            return [json.loads(x)["update"] for x in updates_log.read_text().splitlines()]

        log = tmp_path / "first.log"
        first = _trainer(config / "spec.yaml", checkpoints, log)
        deadline = time.monotonic() + 300
        while len(updates()) < 3:
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no three warm-start updates within 300 s"
            time.sleep(0.1)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
        assert first.returncode == STOPPED_EXIT_CODE, log.read_text()[-3000:]
        stopped = DriverState.model_validate_json(
            (checkpoints / "trainer" / "step-00000000" / "driver.json").read_text()
        )
        assert stopped.warm_start is not None and not stopped.warm_start.done
        assert 3 <= stopped.warm_start.updates < 24
        assert updates() == list(range(1, stopped.warm_start.updates + 1))
        assert _steps(checkpoints) == []

        log = tmp_path / "second.log"
        second = _trainer(config / "spec.yaml", checkpoints, log)
        second.wait(timeout=600)
        err = log.read_text()
        assert second.returncode == 0, err[-3000:]
        assert "resuming the warm start at epoch" in err
        assert updates() == list(range(1, 25))  # 4 traces × 6 epochs, each once
        assert _steps(checkpoints) == [1]
        done = DriverState.model_validate_json(
            (checkpoints / "trainer" / "step-00000001" / "driver.json").read_text()
        )
        assert done.warm_start is not None and done.warm_start.done
