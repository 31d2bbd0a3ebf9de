"""Ray plumbing of a job: a pod's Ray node (start one, join the job's head, follow the head
across its restarts: ``node``, and ``agentrl ray join``: ``cli``), and where the job's processes
run on it (the placement plan, its placement groups and the actors started in their bundles:
``placement``).

Every pod of a job that is a Ray node uses this package: trainer pod 0 starts the head, the
other trainer pods and the rollout worker pods join it. The actors themselves live with what
they run: the trainer's ranks and driver in :mod:`agentrl.trainer.ranks` and
:mod:`agentrl.trainer.pod`, the rollout workers in :mod:`agentrl.rollout.ray_workers`. The
trainer and the rollout tier import this package; it imports neither (an import-linter
contract).
"""
