"""``spec.inference.server: tiny``: the engine pods the same builders make for MI355X, with the
tiny CPU engine's command instead of SGLang's — arguments its own command line accepts, no GPU,
no ROCm environment, and a watchdog that looks for that process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.api.engine import EngineServer
from agentrl.api.validation import load_job
from agentrl.engine.watchdog import WatchdogConfig
from agentrl.reconcile import engine
from agentrl.reconcile.context import BuildContext
from agentrl.tiny.server import serve_tiny

EXAMPLE = Path(__file__).parents[2] / "examples" / "quickstart-cluster.yaml"


def _engine_pod(text: str) -> dict[str, Any]:
    job = load_job(text)
    sts = engine.statefulset(job, BuildContext.for_job(job), replicas=job.spec.inference.engines)
    return sts["spec"]["template"]["spec"]


def test_the_tiny_engine_container_runs_serve_tiny_with_arguments_it_accepts() -> None:
    job = load_job(EXAMPLE.read_text())
    [container, watchdog] = _engine_pod(EXAMPLE.read_text())["containers"]
    assert container["command"] == ["agentrl", "engine", "serve-tiny"]
    # the tiny engine's own click command parses the arguments, to the spec's values
    ctx = serve_tiny.make_context("serve-tiny", list(container["args"]))
    assert ctx.params["model_path"] == "tiny"
    assert ctx.params["host"] == "0.0.0.0"
    assert ctx.params["port"] == 30000 == container["ports"][0]["containerPort"]
    assert ctx.params["context_length"] == job.spec.inference.context_length == 2048
    assert ctx.params["max_running_requests"] == 32
    assert ctx.params["served_model_name"] == "policy"
    assert ctx.params["weight_version"] == "0"
    # the trainer builds its initial policy from the dataset's seed: the same weights
    assert ctx.params["seed"] == job.spec.dataset.seed
    assert str(ctx.params["log_file"]) == "/var/log/agentrl/engine.log"
    # no GPU requested, no ROCm variables: it is a CPU process
    assert container["resources"] == {"requests": {"cpu": "200m", "memory": "512Mi"}}
    assert not [e for e in container["env"] if e["name"].startswith(("HIP_", "HSA_", "ROCM"))]
    assert watchdog["name"] == "watchdog"


def test_the_watchdog_restarts_the_tiny_engine_process_not_sglangs() -> None:
    job = load_job(EXAMPLE.read_text())
    assert WatchdogConfig.from_job(job).engine_cmdline == "serve-tiny"
    job.spec.inference.server = EngineServer.SGLANG
    assert WatchdogConfig.from_job(job).engine_cmdline == "sglang.launch_server"


def test_the_example_places_every_pod_on_the_real_node() -> None:
    job = load_job(EXAMPLE.read_text())
    from agentrl.reconcile import rollout, trainer

    ctx = BuildContext.for_job(job)
    toleration = {"key": "agentrl.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}
    pods = {
        "engine": _engine_pod(EXAMPLE.read_text()),
        "trainer": trainer.trainer_pod_spec(job, ctx, attempt=0),
        "rollout": rollout.deployment(job, ctx, replicas=2)["spec"]["template"]["spec"],
    }
    for name, pod in pods.items():
        assert toleration in pod["tolerations"], name
        for container in pod["containers"]:
            requests = container["resources"]["requests"]
            assert not [r for r in requests if r.endswith("/gpu")], (name, requests)
