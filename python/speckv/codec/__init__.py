"""Coding a model's cache against a predictor: ``SpeculativeCodec`` (``codec``) and
``BlockCodec`` (``blocks``: one token block of a prompt), the coding plan a container is coded
with, built once and read by the walks (``plan``, through the host/GPU seam of ``kernels``,
a layer's ``target`` and its cuts), the walks over layers that encode and decode
(``encode_walk``, ``decode_walk``), the container's layout and blocks (``block_layout``), the
storage modes (``modes``), what a container records (``identity``), a predictor rebuilt from a
stream's description (``from_description``) and the evaluation harness behind ``speckv eval``
(``evaluate``)."""
