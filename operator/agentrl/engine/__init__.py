"""The engine pod's side: the SGLang launcher (``launch``, with ``sglang_check``), the GPU
watchdog sidecar (``watchdog``, ``faults``, ``processes``, ``watchdog_report``) and the
current-weights record it re-pushes after a restart (``weight_pointer``); ``agentrl engine``
(``cli``). Fault classification and flag building are pure; the rest does I/O.

The client the rollout tier and trainer use is :mod:`agentrl.engine_client`; the tiny CPU engine
is :mod:`agentrl.tiny`.
"""
