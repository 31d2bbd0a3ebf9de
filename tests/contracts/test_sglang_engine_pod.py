"""What the engine pod asks of SGLang outside the client: the probe paths the kubelet calls on
the engine port are GET routes of the pinned release, and every ``SGLANG_*`` variable the pod
and the launcher set is one that release reads (a misspelt or retired name is silently
ignored: ``SGLANG_USE_AITER`` lost that way would leave AMD engines on slow kernels)."""

from __future__ import annotations

from typing import Any

from tests.factories import make_job

from agentrl.api import engine_flags, wire
from agentrl.devcluster import sglang_env
from agentrl.reconcile import engine


def _probes_on_the_engine_port() -> set[str]:
    job = make_job().with_spec("inference.gpuResource", "amd.com/gpu").obj()
    probes = [engine.startup_probe(job), engine.readiness_probe(job), engine.liveness_probe()]
    return {
        p["httpGet"]["path"] for p in probes if p["httpGet"]["port"] == wire.ENGINE_PORT
    }


def test_the_kubelets_probe_paths_are_get_routes(sglang: dict[str, Any]) -> None:
    paths = _probes_on_the_engine_port()
    assert paths, "no probe on the engine port (the watchdog's may stand in; then none here)"
    get_routes = {r["path"] for r in sglang["routes"] if "GET" in r["methods"]}
    assert sorted(paths - get_routes) == []


def test_every_sglang_variable_we_set_is_read_by_the_release() -> None:
    job = make_job().with_spec("inference.gpuResource", "amd.com/gpu").obj()
    names = sorted(n for n in engine_flags.rocm_env(job) if n.startswith("SGLANG_"))
    assert {"SGLANG_USE_AITER", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"} <= set(names)
    readers = sglang_env.probe("mentions", names)
    assert sorted(n for n in names if not readers[n]) == []
