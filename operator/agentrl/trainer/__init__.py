"""The asynchronous GRPO trainer: pure GRPO arithmetic (:mod:`agentrl.trainer.grpo`), the loss
(:mod:`agentrl.trainer.loss`), batching and token flattening, step statistics
(:mod:`agentrl.trainer.stats`), the driver loop, checkpoints, weight sync and backends.

Importing this package is light; torch is imported by the modules that need it.
"""
