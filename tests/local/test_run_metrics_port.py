"""``agentrl run --metrics-port``: the run's metrics (episodes, sandbox startup) are scraped over
HTTP while it runs, and the port is released when it ends."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from agentrl.local.cli import run

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _episodes(text: str) -> float:
    """Sum of agentrl_rollout_episodes_total over every class in one scrape."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "agentrl_rollout_episodes_total"
    )


def _registry_total(name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_a_taken_metrics_port_fails_the_run_before_it_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            run,
            [str(QUICKSTART), "--quiet", "--no-ray", "--metrics-port", str(port),
             "--run-dir", str(tmp_path / "run")],
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"--metrics-port {port}: cannot serve metrics there" in result.output
    assert not (tmp_path / "run" / "logs" / "steps.jsonl").exists()


@pytest.mark.slow
def test_a_run_serves_its_episode_counts_while_it_runs(tmp_path: Path) -> None:
    manifest = yaml.safe_load(QUICKSTART.read_text())
    spec = manifest["spec"]
    spec["trainer"]["trajectoriesPerStep"] = 4
    spec["rollout"]["groupSize"] = 2
    spec["rollout"]["maxTurns"] = 3
    spec["sandbox"]["concurrency"] = 4
    spec["dataset"]["maxTasks"] = 8
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    port = _free_port()
    before = _registry_total("agentrl_rollout_episodes_total")
    startups_before = _registry_total("agentrl_sandbox_startup_seconds_count", provider="local")

    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as response:
                    seen.append(_episodes(response.read().decode()))
            except (urllib.error.URLError, ConnectionError):
                pass
            done.wait(0.2)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        result = CliRunner().invoke(
            run,
            [str(path), "--quiet", "--no-ray", "--max-steps", "1", "--skip-eval",
             "--metrics-port", str(port), "--run-dir", str(tmp_path / "run")],
        )  # fmt: skip
    finally:
        done.set()
        scraper.join()
    assert result.exit_code == 0, result.output
    # this process ran the job, so its scrapes counted the run's episodes as they finished
    assert seen, "no scrape reached the metrics port during the run"
    assert max(seen) >= before + 1
    # every episode ran in a local sandbox made through open_provider, as in a rollout worker:
    # its create -> exec-ready time is in the histogram (episodes cut short at the last step
    # made sandboxes too, so there are at least as many as finished episodes)
    episodes = _registry_total("agentrl_rollout_episodes_total") - before
    startups = (
        _registry_total("agentrl_sandbox_startup_seconds_count", provider="local")
        - startups_before
    )
    assert episodes >= 4 and startups >= episodes
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
