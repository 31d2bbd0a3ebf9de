"""agentrl: run agentic RL jobs (SWE agents trained with asynchronous GRPO) on Kubernetes.

The public surface is small on purpose: the version, and the API models re-exported from
:mod:`agentrl.api`. Everything else is reached through its package (``agentrl.reconcile``,
``agentrl.trainer.grpo``, ...), which keeps ``import agentrl`` cheap for the operator image.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
