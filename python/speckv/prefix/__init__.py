"""Many caches kept on a ``speckv.store`` backend, deduplicated by token block: ``PrefixStore``
(predicted, ``prefix_store``), ``FreePrefixStore`` (no predictor, ``free_store``), and the
token-block hash chain both key by (``block_chain``)."""
