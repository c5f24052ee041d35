"""Coding a model's cache against a predictor: ``SpeculativeCodec`` (``codec``), the walks over
layers that encode and decode (``encode_walk``, ``decode_walk``), the coding parameters made
once from a calibration (``coding_params``, ``joint_models``, ``kernels``, ``target``), the
blocks and modes of a stream (``block_layout``, ``modes``, ``identity``, ``parallel``), a
predictor rebuilt from a stream's description (``from_description``) and the evaluation
harness behind ``speckv eval`` (``evaluate``)."""
