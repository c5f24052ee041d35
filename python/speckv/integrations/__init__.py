"""Bridges from speckv to other systems (each imports its system only when imported itself).

- ``speckv.integrations.vllm_tier``: ``SpeckvTier``, a secondary tier for vLLM's own tiered
  offloading (``OffloadingConnector`` + ``TieringOffloadingSpec``; needs vLLM), over
  ``tier_jobs`` (its work, engine-free), ``tier_config`` (its settings) and ``chunk_codec``
  (an offload chunk coded into a store entry);
- ``speckv.integrations.vllm``: ``SpeckvConnector``, a vLLM KV connector (a compressed,
  lossless prefix tier; needs vLLM);
- ``speckv.integrations.engine``: ``EngineStore``, the prefix store a serving engine hosts
  (built from the checkpoint folder and a calibration; no engine needed);
- ``speckv.integrations.paged``: vLLM's paged KV layouts, read and written by whole blocks;
- ``speckv.integrations.lmcache``: the ``"speckv"`` LMCache serde.
"""
