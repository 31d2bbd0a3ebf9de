"""A pod's Ray node: start one, join the job's head, follow the head across its restarts.

Every pod of a job that is a Ray node uses this package: trainer pod 0 starts the head, the
other trainer pods and the rollout worker pods join it (``agentrl ray join``, the rollout pods'
command). The trainer and the rollout tier both import it; it imports neither.
"""
