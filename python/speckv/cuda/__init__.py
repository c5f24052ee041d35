"""The CUDA module: the codec's work done where the cache lives, on the GPU.

Two programs, each the same source the CPU tests build for the host and compare with the Rust
path bit for bit: ``cuda/speckv_params.cu`` computes the coding parameters (fp8 quantisation
of a cache, the coder's float32 ``mu`` from a prediction, sigma codes), exactly the arrays the
Rust coder reads; ``cuda/speckv_coder.cu`` codes a predicted stream's chunks (``encode``), so
that only coded bytes cross to the host: the stream ``speckv.encode`` writes, byte for byte.

Loading: the sources ship inside the extension (``_speckv.cuda_sources``); on first use they
are compiled just in time with NVRTC (``cuda.bindings``, which PyTorch's CUDA wheels install),
for the GPU's architecture, to PTX cached on disk (``$SPECKV_CACHE_DIR/cuda``), then loaded
with the CUDA driver into torch's current context and launched on torch's current stream.
Nothing here imports torch or CUDA packages until a function is called, and `available()`
says whether one can be.

>>> import speckv.cuda
>>> isinstance(speckv.cuda.available(), bool)
True
"""

from __future__ import annotations

from .coder import ROUND_SCALARS, ExactTables, JointModel, encode, encode_joint, exact_tables, lane_capacity
from .module import (
    BLOCK,
    CHUNK_BLOCK,
    MAX_BLOCKS,
    PROGRAMS,
    CudaUnavailableError,
    available,
    compile_kernels,
    source_digest,
)
from .params import STATS_ROWS, channel_sums, coding_mu, fp8_quantize, relative_sigma_codes, sigma_codes

__all__ = [
    "BLOCK",
    "CHUNK_BLOCK",
    "MAX_BLOCKS",
    "PROGRAMS",
    "ROUND_SCALARS",
    "STATS_ROWS",
    "CudaUnavailableError",
    "ExactTables",
    "JointModel",
    "available",
    "channel_sums",
    "coding_mu",
    "compile_kernels",
    "encode",
    "encode_joint",
    "exact_tables",
    "fp8_quantize",
    "lane_capacity",
    "relative_sigma_codes",
    "sigma_codes",
    "source_digest",
]
