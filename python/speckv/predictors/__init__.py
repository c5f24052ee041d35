"""What guesses the cache, and how it is fitted: the ``Predictor`` interface and the light
predictors (``base``), the model's own first layers with maps for the rest (``early_exit``),
layer-by-layer runs (``layerwise``), the maps and their features (``linear_map``, ``rope``,
``joint_fit``), the sigmas measured on calibration text (``calibration``), and what a predictor
costs against a prefill (``cost``, ``budget``)."""
