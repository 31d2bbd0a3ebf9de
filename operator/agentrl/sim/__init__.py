"""Capacity planner and rollout simulator (``agentrl plan``).

Pure: it reads an ``AgentRLJob`` and parameters and returns pydantic models; no cluster, no
clock, no I/O outside ``cli``/``plots``. Layout, one concept per module:

- ``architectures``: model shapes (built-in table, HF config.json reader)
- ``hardware``: GPU products and their node labels
- ``params``: every assumption, with its reason, and the report's scenarios
- ``kvcache``: KV bytes per token, pool size, what fits
- ``static_plan``: arithmetic figures of a manifest
- ``memory``: the trainer's memory per GPU and the checkpoint volume's use (``agentrl
  validate`` refuses a trainer that cannot fit)
- ``engine_model`` / ``simulation``: the discrete-event simulation
- ``plan``: static plan + simulation + bottleneck, and ``check_manifest_against_plan``
- ``manifest_check``: manifest settings at odds with the plan (the warnings ``plan`` adds)
- ``calibration``: the report's figures against the simulated ones
- ``render`` / ``plots`` / ``cli``: output
"""

from agentrl.sim.plan import Plan, check_manifest_against_plan, plan_job

__all__ = ["Plan", "check_manifest_against_plan", "plan_job"]
