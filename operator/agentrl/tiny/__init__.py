"""The tiny policy: a word-level torch model small enough to train with GRPO on two CPU cores
(``policy``), its word tokenizer (``tokenizer``), and the tiny engine that serves it with
SGLang's HTTP API (``server``, ``agentrl engine serve-tiny``) including the distributed weight
updates (``weight_updates``). ``agentrl run``, the local cluster and the tests use it where a
real model would need a GPU.
"""
