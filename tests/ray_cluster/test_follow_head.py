"""The rollout worker pod's command against real Ray heads on this machine: it waits for a head
that is not up yet (the trainer's pod 0 starts after the rollout pods), joins it, joins the next
head after the trainer restarts, and stops its Ray processes when the kubelet sends SIGTERM.

The command is the one the operator renders (``reconcile.rollout.worker_command``) with
``$(RAY_HEAD_ADDRESS)`` expanded as the kubelet does, run with the pod's Ray token."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl.ray_cluster.node import NodeOffer, start_ray_node, stop_ray_node
from agentrl.reconcile import rollout
from tests.factories import make_job

pytest.importorskip("ray", reason="the ray extra")
pytestmark = pytest.mark.slow  # three Ray heads in turn and a joining node: about a minute

#: Outside Ray's default worker port range (10002-19999) and away from the other Ray tests'.
PORT = 26393
TOKEN = "a-token-of-the-job-0123456789abcdef"


def _alive(env: dict[str, str], port: int = PORT) -> int:
    """Alive nodes of the head at ``port``, asked by a driver process as the trainer's would."""
    code = (
        "import ray\n"
        f"ray.init(address='127.0.0.1:{port}', log_to_driver=False)\n"
        "print(sum(1 for n in ray.nodes() if n['Alive']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def _wait_alive(env: dict[str, str], want: int, timeout: float = 120, port: int = PORT) -> None:
    deadline = time.monotonic() + timeout
    while (n := _alive(env, port)) != want:
        assert time.monotonic() < deadline, f"{n} alive nodes, wanted {want}"
        time.sleep(2)


def _start_head(env: dict[str, str], port: int, temp_dir: Path) -> subprocess.Popen[bytes]:
    """A Ray head as the trainer's pod 0 starts it, in exactly ``env`` (start_ray_node passes
    on this process's environment)."""
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return start_ray_node(NodeOffer(cpu=1), port=port, temp_dir=str(temp_dir))
    finally:
        os.environ.clear()
        os.environ.update(old)


def _descendants(root: int) -> set[int]:
    """Live processes below ``root`` (its Ray node's processes: ray start, raylet, workers)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _living(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X"):
            out.add(pid)
    return out


@pytest.mark.timeout(420)
def test_the_rollout_worker_waits_for_the_head_and_follows_it_across_restarts(
    tmp_path: Path,
) -> None:
    job = make_job("swe").obj()
    command = [
        arg.replace("$(RAY_HEAD_ADDRESS)", f"127.0.0.1:{PORT}")
        for arg in rollout.worker_command(job)
    ]
    assert command[:3] == ["agentrl", "ray", "join"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env = {**clean, "HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
    # Ray's socket paths must stay under 108 bytes: short session directories.
    short = Path(tempfile.mkdtemp(prefix="fh-", dir="/tmp"))
    log = (tmp_path / "worker.log").open("wb")
    # the worker's node keeps its session under $RAY_TMPDIR, as a pod has its own /tmp
    worker = subprocess.Popen(
        command,
        env={**env, "RAY_TMPDIR": str(short / "w")},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    heads: list[subprocess.Popen[bytes]] = []

    def start_head(i: int) -> None:
        heads.append(_start_head(env, PORT, short / f"h{i}"))

    try:
        # no head yet: the worker waits (a bare `ray start --address` exits 1 here)
        time.sleep(8)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()

        start_head(0)
        _wait_alive(env, 2)  # the head and the worker's node

        # the trainer pod restarts: its head goes away and a new one comes up at the same name
        stop_ray_node(heads[0])
        text = lambda: (tmp_path / "worker.log").read_text(errors="replace")  # noqa: E731
        deadline = time.monotonic() + 60
        while "left the Ray head" not in text():
            assert time.monotonic() < deadline, text()[-3000:]
            time.sleep(1)
        assert worker.poll() is None
        start_head(1)
        _wait_alive(env, 2)
        assert text().count("joining the Ray head") == 2

        # the kubelet stops the pod: the worker leaves and takes its Ray processes with it
        node = _descendants(worker.pid)
        assert len(node) >= 2  # ray start and the raylet at least
        os.kill(worker.pid, signal.SIGTERM)
        assert worker.wait(60) == 0
        _wait_alive(env, 1)
        assert _living(node) == set()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        for head in heads:
            stop_ray_node(head)
        log.close()
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_stopped_head_exits_by_its_own_hand_within_the_grace_period(tmp_path: Path) -> None:
    """:func:`stop_ray_node` on a head (the trainer's pod 0 at the end of its run) ends through
    ``ray start``'s own SIGTERM handler, which exits 1 after stopping its processes, well within
    a grace period shorter than Ray's 30 s drain default: no SIGKILL at the grace period's end
    (exit -9). Ray's drain on SIGTERM asks the GCS that the same signal is stopping, so with it
    on the head only exits once the drain's request times out."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env = {**clean, "HOME": str(tmp_path)}
    short = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))
    head = _start_head(env, PORT + 1, short)
    try:
        _wait_alive(env, 1, port=PORT + 1)  # up, its raylet registered: what a drain needs
        processes = _descendants(head.pid)
        assert len(processes) >= 2  # the GCS and the raylet at least
        stop_ray_node(head, grace_seconds=15)
        assert head.returncode == 1, head.returncode
        assert _living(processes) == set()
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(short, ignore_errors=True)
