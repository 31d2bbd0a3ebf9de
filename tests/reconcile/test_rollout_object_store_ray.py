"""The rollout worker pod's object store, as the real Ray sizes it: a node started with the
environment the operator gives the pod gets exactly the store the pod's /dev/shm is sized for
(``reconcile.rollout.object_store_bytes``), not 30% of the machine's memory.

Ray reads the cap when its constants are imported, so each start is a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentrl.api.quantities import parse_quantity
from agentrl.reconcile import rollout
from agentrl.reconcile.context import BuildContext
from tests.factories import make_job

pytest.importorskip("ray", reason="the ray extra")
pytestmark = pytest.mark.slow  # a local Ray head: about ten seconds

START = """
import json, ray
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
print(json.dumps({"store": int(ray.cluster_resources()["object_store_memory"])}))
ray.shutdown()
"""


def test_a_worker_pods_environment_gives_ray_the_store_its_dev_shm_holds() -> None:
    # 1Gi: small enough for any test machine (Ray's own default would be 30% of all its RAM)
    job = make_job("swe", "rl").with_rollout(memory="1Gi").obj()
    pod = rollout.deployment(job, BuildContext.for_job(job), replicas=1)["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # 1 GiB × 0.3 = 322122547.2 bytes
    assert env[rollout.OBJECT_STORE_CAP_ENV] == "322122547"
    run = subprocess.run(
        [sys.executable, "-c", START],
        env={**os.environ, rollout.OBJECT_STORE_CAP_ENV: env[rollout.OBJECT_STORE_CAP_ENV]},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    store = json.loads(run.stdout.strip().splitlines()[-1])["store"]
    assert store == 322122547
    # and the pod's /dev/shm holds it, with Ray's 10% to spare: 307.2 MiB × 1.1 → 338Mi
    [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["sizeLimit"] == "338Mi"
    assert parse_quantity(shm["emptyDir"]["sizeLimit"]) >= store * 1.1
