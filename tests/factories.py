"""Object factories shared by the tests: AgentRLJob manifests (``make_job``) and the Kubernetes
objects the operator observes (``make_pod``, ``make_statefulset``, ``make_trainer_job``,
``make_deployment``), written the way the API server returns them.

Fluent, like JobSet's test wrappers: ``make_job("swe").with_engines(4).suspended().obj()``.
Every ``with_*`` returns the factory; ``manifest()`` gives the dict, ``obj()`` the parsed
``AgentRLJob``; ``copy()`` forks a module's base job. This is the one job factory of tests/ and
e2e/ (tests/README.md).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Self

from agentrl.api import AgentRLJob
from agentrl.api.wire import SandboxPods


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict, creating levels as needed."""
    *parents, leaf = path.split(".")
    cur = doc
    for key in parents:
        cur = cur.setdefault(key, {})
    cur[leaf] = value


class JobFactory:
    """A minimal valid AgentRLJob manifest, adjusted step by step."""

    def __init__(self, name: str, namespace: str | None) -> None:
        self._doc: dict[str, Any] = {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "metadata": {"name": name},
            "spec": {"model": {"source": {"path": "/models/policy"}}},
        }
        if namespace is not None:
            self._doc["metadata"]["namespace"] = namespace

    # ---- generic ---------------------------------------------------------------------------

    def with_spec(self, path: str, value: Any) -> Self:
        """Set ``spec.<path>`` (camelCase, dotted), e.g. ``with_spec("rollout.groupSize", 4)``."""
        _set(self._doc["spec"], path, value)
        return self

    def without_spec(self, path: str) -> Self:
        """Remove ``spec.<path>`` if present, e.g. ``without_spec("trainer.parallelism")``."""
        *parents, leaf = path.split(".")
        cur = self._doc["spec"]
        for key in parents:
            cur = cur.get(key, {})
        cur.pop(leaf, None)
        return self

    def with_metadata(self, path: str, value: Any) -> Self:
        """Set ``metadata.<path>`` (``uid``, ``generation``, ``labels``...)."""
        _set(self._doc["metadata"], path, value)
        return self

    # ---- named adjustments -----------------------------------------------------------------

    def with_uid(self, uid: str) -> Self:
        return self.with_metadata("uid", uid)

    def with_generation(self, generation: int) -> Self:
        return self.with_metadata("generation", generation)

    def with_labels(self, **labels: str) -> Self:
        return self.with_metadata("labels", dict(labels))

    def with_model(self, **fields: Any) -> Self:
        """Set ``spec.model.<key>`` for each field (``source``, ``servedName``...)."""
        for key, value in fields.items():
            self.with_spec(f"model.{key}", value)
        return self

    def with_served_model(self, path: str, served_name: str) -> Self:
        """``spec.model``: weights at ``path``, served to the rollout tier as ``served_name``."""
        return self.with_spec("model", {"source": {"path": path}, "servedName": served_name})

    def with_model_path(self, path: str) -> Self:
        return self.with_spec("model.source", {"path": path})

    def with_inference(self, **fields: Any) -> Self:
        """Set ``spec.inference.<key>`` for each field; with none, an explicit empty
        ``inference`` (the engine tests' spelling of "all defaults")."""
        self._doc["spec"].setdefault("inference", {})
        for key, value in fields.items():
            self.with_spec(f"inference.{key}", value)
        return self

    def with_engines(self, engines: int, *, gpus_per_engine: int | None = None) -> Self:
        self.with_spec("inference.engines", engines)
        if gpus_per_engine is not None:
            self.with_spec("inference.gpusPerEngine", gpus_per_engine)
        return self

    def with_node_selector(self, **labels: str) -> Self:
        return self.with_spec("inference.nodeSelector", dict(labels))

    def with_tolerations(self, *tolerations: dict[str, Any]) -> Self:
        return self.with_spec("inference.tolerations", list(tolerations))

    def with_watchdog(self, enabled: bool) -> Self:
        return self.with_spec("inference.watchdog.enabled", enabled)

    def with_concurrency(self, concurrency: int) -> Self:
        return self.with_spec("sandbox.concurrency", concurrency)

    def with_sandbox(self, **fields: Any) -> Self:
        for key, value in fields.items():
            self.with_spec(f"sandbox.{key}", value)
        return self

    def with_e2b(self, *, max_concurrent: int) -> Self:
        return self.with_sandbox(
            provider="e2b",
            e2b={"apiKeySecretRef": {"name": "e2b"}, "maxConcurrent": max_concurrent},
        )

    def with_workers(self, workers: int) -> Self:
        return self.with_spec("rollout.workers", workers)

    def with_rollout(self, **fields: Any) -> Self:
        for key, value in fields.items():
            self.with_spec(f"rollout.{key}", value)
        return self

    def with_dataset(self, **fields: Any) -> Self:
        for key, value in fields.items():
            self.with_spec(f"dataset.{key}", value)
        return self

    def with_trainer(self, **fields: Any) -> Self:
        for key, value in fields.items():
            self.with_spec(f"trainer.{key}", value)
        return self

    def with_network(self, **fields: str) -> Self:
        return self.with_spec("trainer.network", dict(fields))

    def with_model_pvc(self, pvc: str, path: str = "qwen") -> Self:
        return self.with_spec("model.source", {"path": path, "pvc": pvc})

    def with_checkpoint_volume(self, claim: str) -> Self:
        return self.with_spec("trainer.checkpoint.volume", claim)

    def suspended(self, suspend: bool = True) -> Self:
        return self.with_spec("suspend", suspend)

    def with_deadline(self, seconds: int) -> Self:
        return self.with_spec("activeDeadlineSeconds", seconds)

    def with_ttl(self, seconds: int) -> Self:
        return self.with_spec("ttlSecondsAfterFinished", seconds)

    def with_status(self, status: dict[str, Any]) -> Self:
        self._doc["status"] = copy.deepcopy(status)
        return self

    # ---- results ---------------------------------------------------------------------------

    def copy(self, name: str | None = None) -> JobFactory:
        """An independent factory with this one's manifest (renamed to ``name`` if given), to
        adjust a module's base job per test without touching the base:
        ``BASE.copy().with_sandbox(allowInternet=True).obj()``."""
        twin = from_manifest(self._doc)
        if name is not None:
            twin.with_metadata("name", name)
        return twin

    def manifest(self) -> dict[str, Any]:
        """The manifest as a dict (a copy)."""
        return copy.deepcopy(self._doc)

    def obj(self) -> AgentRLJob:
        """The parsed job."""
        return AgentRLJob.model_validate(self.manifest())


def make_job(name: str = "demo", namespace: str | None = "team") -> JobFactory:
    """A factory for a minimal valid job named ``name`` in ``namespace``."""
    return JobFactory(name, namespace)


def from_manifest(manifest: dict[str, Any]) -> JobFactory:
    """A factory starting from ``manifest`` (a copy), e.g. the validation corpus's base job
    (``tests.api.cases.BASE``)."""
    factory = JobFactory.__new__(JobFactory)
    factory._doc = copy.deepcopy(manifest)
    return factory


def sandbox_pods_of(
    job: AgentRLJob, *, namespace: str | None = None, uid: str | None = None
) -> SandboxPods:
    """The sandbox pod template as a rollout worker receives it: ``runtime.yaml`` of the
    ConfigMap the operator's own builder renders for ``job`` (provider ``kubernetes``), parsed.
    ``namespace`` and ``uid`` default to the job's metadata (a job read from the API server)."""
    import yaml

    from agentrl.api.wire import CONFIG_RUNTIME_KEY, RuntimeConfig
    from agentrl.reconcile.configmap import config_map
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.policies.suspend import workload_scale

    ctx = BuildContext.for_job(job, namespace=namespace, uid=uid)
    text = config_map(job, ctx, workload_scale(job))["data"][CONFIG_RUNTIME_KEY]
    pods = RuntimeConfig.model_validate(yaml.safe_load(text)).sandbox.pods
    assert pods is not None, "sandbox pods are in runtime.yaml only for provider kubernetes"
    return pods


# ---- observed objects ----------------------------------------------------------------------


class PodFactory:
    """A pod of a job as the API server returns it."""

    def __init__(self, name: str, component: str, job: str) -> None:
        self._pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"agentrl.dev/job": job, "app.kubernetes.io/component": component},
                "annotations": {},
            },
            "status": {"phase": "Pending", "conditions": [], "containerStatuses": []},
        }

    def _condition(
        self, type_: str, status: str, reason: str | None = None, message: str | None = None
    ) -> None:
        cond: dict[str, Any] = {"type": type_, "status": status}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        self._pod["status"]["conditions"].append(cond)

    def unschedulable(self, message: str) -> Self:
        """Pending: the scheduler found no node."""
        self._pod["status"]["phase"] = "Pending"
        self._condition("PodScheduled", "False", "Unschedulable", message)
        return self

    def running(self, *, ready: bool = True, containers: tuple[str, ...] = ("main",)) -> Self:
        self._pod["status"]["phase"] = "Running"
        self._condition("PodScheduled", "True")
        self._condition("Ready", "True" if ready else "False")
        for name in containers:
            self._pod["status"]["containerStatuses"].append(
                {"name": name, "ready": ready, "restartCount": 0, "state": {"running": {}}}
            )
        return self

    def waiting(
        self,
        container: str,
        reason: str,
        message: str = "",
        *,
        restarts: int = 0,
        last_reason: str | None = None,
        last_exit_code: int | None = None,
    ) -> Self:
        """A container waiting (ImagePullBackOff, CrashLoopBackOff, ...)."""
        self._condition("PodScheduled", "True")
        status: dict[str, Any] = {
            "name": container,
            "ready": False,
            "restartCount": restarts,
            "state": {"waiting": {"reason": reason, "message": message}},
        }
        if last_reason is not None:
            status["lastState"] = {
                "terminated": {"reason": last_reason, "exitCode": last_exit_code}
            }
        self._pod["status"]["containerStatuses"].append(status)
        return self

    def failed(self, container: str, exit_code: int, message: str = "") -> Self:
        """Failed (restartPolicy Never): the container terminated with ``exit_code``; with
        ``terminationMessagePolicy: FallbackToLogsOnError`` the kubelet puts the tail of its
        log in ``message``."""
        self._pod["status"]["phase"] = "Failed"
        self._condition("PodScheduled", "True")
        self._condition("Ready", "False", "PodFailed")
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": "Error"}
        if message:
            terminated["message"] = message
        self._pod["status"]["containerStatuses"].append(
            {
                "name": container,
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        )
        return self

    def restarts(self, container: str, count: int) -> Self:
        for status in self._pod["status"]["containerStatuses"]:
            if status["name"] == container:
                status["restartCount"] = count
        return self

    def annotated(self, key: str, value: dict[str, Any] | str) -> Self:
        raw = value if isinstance(value, str) else json.dumps(value)
        self._pod["metadata"]["annotations"][key] = raw
        return self

    def deleting(self, until: str = "2026-01-01T00:00:00Z") -> Self:
        """Deleted; ``until``: its deletionTimestamp (deletion time + grace period)."""
        self._pod["metadata"]["deletionTimestamp"] = until
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._pod)


def make_pod(name: str, component: str, job: str = "demo") -> PodFactory:
    """A pod of ``job``'s ``component`` (engine, trainer, rollout, sandbox)."""
    return PodFactory(name, component, job)


def make_statefulset(replicas: int, ready: int = 0) -> dict[str, Any]:
    """The engine StatefulSet as observed."""
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


def make_deployment(replicas: int, ready: int = 0) -> dict[str, Any]:
    """The rollout Deployment as observed."""
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


def make_trainer_job(
    *,
    attempt: int = 0,
    active: int = 0,
    succeeded: int = 0,
    failed: int = 0,
    condition: tuple[str, str, str] | None = None,
    suspend: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    """The trainer Job as observed; ``condition``: (type, reason, message) set True."""
    job: dict[str, Any] = {
        "metadata": {
            "name": "demo-trainer",
            "uid": f"job-uid-{attempt}",
            "annotations": {"agentrl.dev/trainer-attempt": str(attempt)},
        },
        "spec": {"suspend": suspend},
        "status": {"active": active, "succeeded": succeeded, "failed": failed, "conditions": []},
    }
    if condition is not None:
        type_, reason, message = condition
        job["status"]["conditions"].append(
            {"type": type_, "status": "True", "reason": reason, "message": message}
        )
    if deleting:
        job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return job
