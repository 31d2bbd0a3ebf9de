"""One reconcile of one AgentRLJob: observe → plan (pure) → act → write status once.

Order of actions, and why:

1. read the job and its children (StatefulSet, trainer Job, rollout Deployment, the job's pods),
   and the Nodes while some GPU pod of the job is not scheduled (the GPU preflight,
   ``reconcile.preflight``; a refused list becomes the condition's message, not an error);
2. :func:`agentrl.reconcile.plan.plan` decides everything without I/O;
3. server-side apply each child whose built object changed since this operator last applied it
   (every child on the periodic resync, and after a child is deleted behind our back), so a
   quiet job costs reads and no writes;
4. write the status — only when it changed — in one merge patch;
5. delete what the plan says (a failed trainer attempt) *after* the status write, so the restart
   is counted before its evidence goes;
6. post events only once the status write succeeded (a failed write retries the whole
   reconcile, and the events with it, never twice).

A job the models refuse (possible only if the CRD in the cluster is older than the operator)
gets Ready=False/InvalidSpec with the validation message, and nothing is applied.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agentrl.api import AgentRLJob, AgentRLJobStatus, ConditionType, Reason, SandboxProvider
from agentrl.api import validation as api_validation
from agentrl.controller import metrics
from agentrl.controller.engine_metrics import collect_engine_metrics
from agentrl.controller.kube import KubeAPI, NodesForbidden, TemplateImmutable
from agentrl.controller.settings import OperatorSettings
from agentrl.controller.workqueue import Key
from agentrl.reconcile import labels, names, nodes, preflight, prepull, ray_auth
from agentrl.reconcile.constants import LABEL_COMPONENT, Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import Observed, observe
from agentrl.reconcile.plan import Plan, plan
from agentrl.reconcile.policies import autoscale
from agentrl.reconcile.priority import with_priority_classes
from agentrl.reconcile.status import format_time, parse_time, status_changed

log = logging.getLogger("agentrl.operator")


def _digest(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def status_patch(status: AgentRLJobStatus) -> dict[str, Any]:
    """The status as a merge patch: every field, unset ones as null, so a field that went back
    to unset (``sandbox.limitedBy`` once a quota lifts) is removed rather than left stale."""
    return status.model_dump(mode="json", by_alias=True)


class ConditionTally:
    """Each job's last conditions, summed into ``agentrl_jobs_by_condition``."""

    def __init__(self) -> None:
        self._jobs: dict[Key, dict[str, str]] = {}

    def update(self, key: Key, conditions: dict[str, str]) -> None:
        self._jobs[key] = conditions
        self._publish()

    def forget(self, key: Key) -> None:
        if self._jobs.pop(key, None) is not None:
            self._publish()

    def _publish(self) -> None:
        counts: dict[tuple[str, str], int] = {
            (t.value, s): 0 for t in ConditionType for s in ("True", "False", "Unknown")
        }
        for conditions in self._jobs.values():
            for type_, status in conditions.items():
                counts[(type_, status)] = counts.get((type_, status), 0) + 1
        for (type_, status), n in counts.items():
            metrics.JOBS_BY_CONDITION.labels(condition=type_, status=status).set(n)


class Reconciler:
    """Reconciles jobs by key; one instance per operator, shared by the workers."""

    def __init__(
        self,
        api: KubeAPI,
        settings: OperatorSettings,
        *,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.now = now or (lambda: datetime.now(UTC))  # injectable for tests
        self.tally = ConditionTally()
        self._applied: dict[Key, dict[tuple[str, str], str]] = {}
        #: jobs whose Ray token Secret exists (created now or found): not created again
        self._ray_tokens: set[Key] = set()
        self._nodes_forbidden_logged = False

    def forget_applied(self, key: Key) -> None:
        """Re-apply every child of ``key`` on its next reconcile (a child was deleted, or it is
        the periodic resync)."""
        self._applied.pop(key, None)
        self._ray_tokens.discard(key)  # a deleted token Secret is made again (a new token)

    async def reconcile(self, key: Key) -> float | None:
        """Reconcile one job; returns seconds after which to look again (None: on events)."""
        started = time.monotonic()
        try:
            body = await self.api.get_job(key.namespace, key.name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.tally.forget(key)
                self._applied.pop(key, None)
                self._ray_tokens.discard(key)
                metrics.RECONCILES.labels(result="gone").inc()
                return None
            job, errors = api_validation.validate_document(body)
            if job is None:
                await self._refuse(key, body, [f"{e.path}: {e.message}" for e in errors])
                return None
            # the operator's PriorityClasses fill the job's unset ones, once, before anything
            # reads the spec (builders, quotas, the ConfigMap)
            job = with_priority_classes(job, self.settings.priority_classes)
            result = await self._reconcile_valid(key, body, job)
            metrics.RECONCILES.labels(result="ok").inc()
            return result
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    async def _observe(
        self, job: AgentRLJob, namespace: str
    ) -> tuple[Observed, list[dict[str, Any]]]:
        name = job.metadata.name
        statefulset = await self.api.get_child("StatefulSet", namespace, names.engine(name))
        trainer_job = await self.api.get_child("Job", namespace, names.trainer(name))
        deployment = await self.api.get_child("Deployment", namespace, names.rollout(name))
        pods = await self.api.list_pods(namespace, labels.job_selector(job))
        quotas = (
            await self.api.list_resource_quotas(namespace)
            if job.spec.sandbox.provider == SandboxProvider.KUBERNETES
            else []
        )
        observed = observe(
            statefulset=statefulset,
            trainer_job=trainer_job,
            deployment=deployment,
            pods=pods,
            resource_quotas=quotas,
        )
        if preflight.needs_nodes(job, observed):
            observed = observed.model_copy(update={"nodes": await self._nodes()})
        return observed, pods

    async def _nodes(self) -> nodes.NodesSeen:
        """The Node list for the GPU preflight; a refusal becomes its message, not an error."""
        try:
            return nodes.nodes_seen(await self.api.list_nodes())
        except NodesForbidden as exc:
            if not self._nodes_forbidden_logged:  # once: the condition says it on every job
                log.warning("cannot list nodes for the GPU preflight: %s", exc)
                self._nodes_forbidden_logged = True
            return nodes.nodes_unreadable(f"403 Forbidden: {exc}")

    async def _reconcile_valid(
        self, key: Key, body: dict[str, Any], job: AgentRLJob
    ) -> float | None:
        ctx = BuildContext.for_job(job, images=self.settings.images, namespace=key.namespace)
        observed, pods = await self._observe(job, key.namespace)
        now = self.now()
        decided: Plan = plan(
            job, ctx, observed, generation=int(body["metadata"].get("generation", 0)), now=now
        )
        if decided.delete_job:
            log.info("deleting %s: ttlSecondsAfterFinished has passed", key)
            await self.api.delete_job(key.namespace, key.name)
            self.tally.forget(key)
            return None
        await self._ensure_ray_token(key, job, ctx)
        await self._apply_children(key, decided.children)
        status, events = decided.status, list(decided.events)
        requeue = decided.requeue_after_seconds
        progress = await self._prepull(key, job, ctx)
        status = status.model_copy(
            update={"sandbox": status.sandbox.model_copy(update={"pre_pull": progress})}
        )
        if job.spec.sandbox.autoscale.enabled:
            move = await self._autoscale(key, body, job, observed, pods, now)
            if move is not None:
                status = autoscale.record_move(status, move, now)
                event = autoscale.move_event(move)
                if event is not None:
                    events.append(event)
                if move.recheck_after_seconds is not None:
                    requeue = min(requeue or move.recheck_after_seconds, move.recheck_after_seconds)
        # decided once everything that goes into the status is in: write only on a change
        write = status_changed(job.status, status)
        if write:
            await self.api.patch_status(key.namespace, key.name, status_patch(status))
            metrics.STATUS_WRITES.inc()
        for ref in decided.delete:
            await self.api.delete(ref)
            self._applied.get(key, {}).pop((ref.kind, ref.name), None)
        for event in events:
            await self.api.post_event(
                body, type_=event.type, reason=event.reason, message=event.message
            )
        self.tally.update(key, {c.type: c.status for c in status.conditions})
        return requeue

    async def _ensure_ray_token(self, key: Key, job: AgentRLJob, ctx: BuildContext) -> None:
        """The job's Ray token Secret, created once with a fresh random token (an existing one
        is kept: running pods hold its token); before the pods that reference it."""
        if key in self._ray_tokens:
            return
        secret = ray_auth.ray_token_secret(job, ctx, secrets.token_urlsafe(32))
        if await self.api.create_if_absent(secret):
            log.info("created the Ray token Secret %s/%s", key.namespace, names.ray_token(key.name))
        self._ray_tokens.add(key)

    async def _prepull(self, key: Key, job: AgentRLJob, ctx: BuildContext) -> str | None:
        """Apply the pre-pull DaemonSets (and remove chunks no longer wanted); their progress.

        The images: ``spec.sandbox.image``, the dataset's task images, which the trainer writes
        into the ``NAME-task-images`` ConfigMap applied here (the dataset sits on a volume the
        operator cannot read), then ``prePull.images``. A list the trainer writes later is
        picked up on the next reconcile (the resync at the latest)."""
        selector = {**labels.job_selector(job), LABEL_COMPONENT: Component.PREPULL.value}
        sandbox = job.spec.sandbox
        wanted: list[dict[str, Any]] = []
        if prepull.wanted(job):
            await self._apply_children(key, [prepull.task_images_configmap(job, ctx)])
            listed = await self.api.get_child(
                "ConfigMap", key.namespace, names.task_images(job.metadata.name)
            )
            nodes = await self.api.count_nodes(dict(sandbox.node_selector))
            wanted = prepull.prepull_daemonsets(
                job, ctx, prepull.read_task_images(listed), nodes=nodes
            )
            await self._apply_children(key, wanted)
        # read the DaemonSets only when some are wanted or some may be left from before
        had_prepull = bool(job.status and job.status.sandbox.pre_pull)
        existing = (
            await self.api.list_daemonsets(key.namespace, selector) if wanted or had_prepull else []
        )
        keep = {d["metadata"]["name"] for d in wanted}
        for ds in existing:
            if ds["metadata"]["name"] not in keep:
                await self.api.delete_daemonset(key.namespace, ds["metadata"]["name"])
        current = [d for d in existing if d["metadata"]["name"] in keep]
        progress = prepull.prepull_progress(current) if wanted else None
        return progress.message if progress is not None else None

    async def _autoscale(
        self,
        key: Key,
        body: dict[str, Any],
        job: AgentRLJob,
        observed: Observed,
        pods: list[dict[str, Any]],
        now: datetime,
    ) -> autoscale.ScaleDecision | None:
        """The built-in autoscaler: decide from the engines' metrics, write through /scale.
        Returns the decision when it moved concurrency (None when it held)."""
        engine_metrics = await collect_engine_metrics(
            body, pods, observed, allow_synthetic=self.settings.synthetic_engine_metrics
        )
        last = job.status.sandbox.last_scale_time if job.status else None
        decision = autoscale.decide(
            job,
            engine_metrics,
            current=job.spec.sandbox.concurrency,
            last_scale_time=parse_time(last),
            now=now,
        )
        if decision.concurrency is None:
            return None
        await self.api.scale(key.namespace, key.name, decision.concurrency)
        log.info("%s: %s", key, decision.reason)
        return decision

    async def _apply_children(self, key: Key, children: list[dict[str, Any]]) -> None:
        applied = self._applied.setdefault(key, {})
        for child in children:
            ident = (child["kind"], child["metadata"]["name"])
            digest = _digest(child)
            if applied.get(ident) == digest:
                continue
            try:
                await self.api.apply(child)
            except TemplateImmutable:
                await self._apply_keeping_template(key, child)
            applied[ident] = digest

    async def _apply_keeping_template(self, key: Key, child: dict[str, Any]) -> None:
        """Apply a Job with the pod template of the live one: a running trainer attempt whose
        pods this operator would now build differently (after an upgrade that adds a field to
        them, a PriorityClass say) keeps its pods as they are, since Kubernetes never changes a
        Job's template, while the rest of the Job (``suspend``) still follows the spec. The
        next attempt, a new Job, gets the new template."""
        name = child["metadata"]["name"]
        live = await self.api.get_child(child["kind"], key.namespace, name)
        if live is None:  # deleted meanwhile: nothing is immutable any more
            await self.api.apply(child)
            return
        kept = {**child, "spec": {**child["spec"], "template": live["spec"]["template"]}}
        await self.api.apply(kept)
        log.warning(
            "%s: the running %s %s keeps its pod template (Kubernetes never changes a Job's "
            "template); the next trainer attempt gets the new one",
            key,
            child["kind"],
            name,
        )

    async def _refuse(self, key: Key, body: dict[str, Any], problems: list[str]) -> None:
        """Ready=False/InvalidSpec with the problems; nothing is applied."""
        metrics.RECONCILES.labels(result="invalid").inc()
        message = "; ".join(problems)[:2000]
        previous = body.get("status") or {}
        conditions = [c for c in previous.get("conditions", []) if c.get("type") != "Ready"]
        old = next((c for c in previous.get("conditions", []) if c.get("type") == "Ready"), None)
        if old and old.get("reason") == Reason.INVALID_SPEC.value and old.get("message") == message:
            return
        ready = {
            "type": ConditionType.READY.value,
            "status": "False",
            "reason": Reason.INVALID_SPEC.value,
            "message": message,
            "observedGeneration": body["metadata"].get("generation"),
            "lastTransitionTime": format_time(self.now()),
        }
        await self.api.patch_status(
            key.namespace,
            key.name,
            {"conditions": [ready, *conditions], "readyReason": Reason.INVALID_SPEC.value},
        )
        await self.api.post_event(
            body, type_="Warning", reason=Reason.INVALID_SPEC.value, message=message
        )
        log.warning("%s refused: %s", key, message)
