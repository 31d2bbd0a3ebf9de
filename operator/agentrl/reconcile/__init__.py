"""The pure reconcile layer: ``AgentRLJob`` → the Kubernetes objects the operator applies, the
status it writes and the events it posts.

Nothing here does I/O, reads a clock or the environment: every input (the job, the observed
children, the job's uid, the images, ``now``) is an argument. The kopf handlers in
``agentrl.controller`` read the cluster, call :func:`agentrl.reconcile.plan.plan`, apply what it
returns and write status once; ``agentrl render`` calls the same builders. An import-linter
contract keeps this package free of kopf, lightkube and aiohttp.

One module per child kind (``configmap``, ``engine``, ``trainer``, ``rollout``, ``sandbox``,
``pvc``), ``children`` orders them, ``observed``/``status`` turn what the cluster shows into
conditions, and ``policies/`` holds one small module per policy (suspend, deadline, ttl,
trainer restarts).
"""
