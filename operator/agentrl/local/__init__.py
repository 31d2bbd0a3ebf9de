"""``agentrl run``: one AgentRLJob manifest on one machine (local Ray, local sandboxes, the CPU
engine, the torch trainer). Entry point: :mod:`agentrl.local.cli`; the work:
:mod:`agentrl.local.runner`."""
