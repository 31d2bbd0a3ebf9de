"""The operator: thin kopf-driven I/O around the pure reconcile layer.

Layers, each its own module:

- ``settings``   what the operator was started with (namespaces, images, ports, workers);
- ``kube``       the Kubernetes API the reconciler needs (a Protocol) and its lightkube
                 implementation, counting every request;
- ``workqueue``  a coalescing, delaying queue of job keys (one reconcile per job at a time);
- ``reconciler`` observe → ``agentrl.reconcile.plan.plan`` → apply → one status write →
                 deletes → events;
- ``watches``    label-selected watches of the children that enqueue their owner job;
- ``handlers``   kopf registrations (the AgentRLJob watch, startup/cleanup, liveness);
- ``metrics``    every operator metric, declared once;
- ``cli``        ``agentrl operator``.

No finalizer is ever added (there are no deletion handlers, daemons or timers on the job):
children are owned through ownerReferences, so deleting a job never waits for the operator.
"""
