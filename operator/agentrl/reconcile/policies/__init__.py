"""One small module per policy of the job's lifecycle, each a pure function of the job, what was
observed and ``now``: ``suspend`` (what runs at which scale), ``deadline``
(``activeDeadlineSeconds``), ``ttl`` (``ttlSecondsAfterFinished``) and ``trainer_restarts``
(restart from the last checkpoint up to ``backoffLimit``, counted). ``agentrl.reconcile.plan``
combines them."""
