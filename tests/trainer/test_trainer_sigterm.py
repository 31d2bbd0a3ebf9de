"""The trainer pod's entry point under SIGTERM, as Kubernetes sends it (suspend, drain, pod
deletion): ``agentrl trainer --no-ray`` against a real tiny engine finishes its step, checkpoints
it, exits 143; started again, it continues at the next step — no step repeated, none lost."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api.validation import load_job
from agentrl.engine import tiny
from agentrl.reconcile import configmap
from agentrl.reconcile.constants import CONFIG_RUNTIME_KEY
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.loop import StepRecord
from agentrl.trainer.stopping import STOPPED_EXIT_CODE

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(directory: Path, policy: Path, url: str, max_steps: int) -> Path:
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


@pytest.mark.timeout(600)
def test_sigterm_checkpoints_the_last_step_exits_143_and_a_restart_continues_after_it(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy"
    tiny.save_policy(tiny.new_policy(0, dim=16), policy)
    engine = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "engine", "serve-tiny", "--port", "0",
         "--model-path", str(policy), "--context-length", "2048"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    checkpoints = tmp_path / "ckpt"
    try:
        assert engine.stderr is not None
        url = None
        while url is None:
            line = engine.stderr.readline()
            assert line, "the tiny engine exited before serving"
            found = re.search(r"serving on (http://\S+)", line)
            url = found.group(1) if found else None
        # keep reading its log: a full pipe would block the engine mid-request
        threading.Thread(target=engine.stderr.read, daemon=True).start()
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
    finally:
        engine.terminate()
        engine.wait(timeout=60)
