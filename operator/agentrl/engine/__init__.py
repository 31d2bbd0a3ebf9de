"""Engines: the SGLang launcher (``launch``), the GPU watchdog sidecar (``watchdog``,
``faults``, ``processes``, ``watchdog_report``), the async SGLang client the runtime uses
(``client``), and the tiny CPU engine that speaks the same API for local runs and tests
(``tiny``, ``tiny_server``, ``tokenizer``). Fault classification and flag building are pure;
the rest does I/O. torch is imported only by the tiny engine.
"""
