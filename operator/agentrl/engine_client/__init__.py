"""The client side of an engine, used by the rollout tier, the trainer and the watchdog: the
async SGLang HTTP client (``client``) over its lean keep-alive pool (``keepalive``), and the
trainer's broadcast group for ``weightSync.mode: distributed`` (``weight_group``).

The pod side (launcher, watchdog sidecar, fault classes) is :mod:`agentrl.engine`; the tiny CPU
engine that speaks the same API is :mod:`agentrl.tiny`. torch is imported only inside
``weight_group``'s functions.
"""
