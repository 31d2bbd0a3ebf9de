"""GPU placement that cannot deadlock: the trainer's pods are placed before the engines.

The trainer needs whole nodes (``trainer.gpusPerNode`` GPUs on one node, 8 for the report's
MI355X layout); the engines need a few GPUs each, anywhere. Created together, the scheduler may
spread the engines over every node (for the report's 24 one-GPU engines on four 8-GPU nodes,
8/7/1/8) so that no node keeps 8 free GPUs and the trainer waits forever on a cluster that has
exactly enough. Preferred pod (anti-)affinities (``engine.gpu_node_placement``) only tilt the
scheduler's scores; the default spreading of StatefulSet pods pulls the other way.

So when both request GPUs, the engine StatefulSet is created at 0 replicas and scaled to
``inference.engines`` only once every trainer pod is scheduled. The GPUs left are then exactly
the engines' to take, in any order. The hold applies only while the StatefulSet has never been
scaled up for the running job (it is created at 0, or was scaled to 0 by suspend): engines that
already run are never taken down because the trainer restarts.

A cluster autoscaler sees the trainer's pods first and the engines once the trainer is placed;
``GPUsAvailable`` (``reconcile.preflight``) names the whole shortfall from the start.

Called by ``children.desired_children`` (the replicas) and ``status.engines_verdict`` (the
reason the engines wait).
"""

from __future__ import annotations

from agentrl.api import AgentRLJob
from agentrl.reconcile.constants import Component
from agentrl.reconcile.observed import Observed


def trainer_first(job: AgentRLJob) -> bool:
    """Whether engines and trainer pods compete for GPUs (both request some)."""
    return job.spec.trainer.gpus_per_node > 0 and job.spec.inference.gpus_per_engine > 0


def trainer_pods_scheduled(observed: Observed) -> int:
    """Live trainer pods the scheduler has bound to a node."""
    return sum(
        1
        for p in observed.pods_of(Component.TRAINER)
        if (c := p.condition("PodScheduled")) is not None and c.status == "True"
    )


def engines_held(job: AgentRLJob, observed: Observed | None) -> bool:
    """Whether the engines wait for the trainer's pods to be scheduled. ``observed`` None (what
    ``agentrl render`` prints) shows the steady state: no hold."""
    if observed is None or not trainer_first(job):
        return False
    if observed.engine_set is not None and observed.engine_set.replicas > 0:
        return False  # already scaled up: running engines are never held back
    return trainer_pods_scheduled(observed) < job.spec.trainer.nodes


def engine_replicas(job: AgentRLJob, observed: Observed | None, replicas: int) -> int:
    """The engine StatefulSet's replicas: ``replicas`` (the suspend policy's), or 0 while the
    engines wait for the trainer's pods."""
    return 0 if replicas and engines_held(job, observed) else replicas
