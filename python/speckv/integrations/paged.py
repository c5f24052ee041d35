"""vLLM's paged KV buffers: whole blocks read out as a model cache's ``(K, V)`` and written back.

A serving engine keeps each layer's cache in fixed-size blocks of tokens; a request owns a list
of block ids. speckv codes caches as per-layer ``[1, kv_heads, tokens, head_dim]`` tensors, so
the connector reads a request's blocks into that shape and writes decoded ones back, bit for
bit (pure copies and views: no arithmetic touches a value). Stored blocks are always in that
canonical shape, whatever the engine's layout, so engines of different layouts can share a
store.

Layouts (``PagedLayout``; a buffer of another shape, or an attention kernel whose layout is
not listed, is refused with ``UnsupportedLayoutError`` naming it). vLLM's CPU attention
backend keeps a layer as ``[num_blocks, kv_heads, block_size, 2 * head_dim]``: inside one block
and head, ``B * D`` elements of K, then ``B * D`` of V (B the block size, D the head size),
laid out as its attention kernel (its "ISA", ``vllm.v1.attention.backends.cpu_attn``) reads
them::

    kind       ISA    K (B * D elements)                  V (B * D elements)
    cpu        vec    [D][B]            (K transposed)    [B][D]
    cpu-amx    amx    [B/16][D/2][16][2] (16-token tiles,  [D/16][B/2][16][2] (16-channel tiles,
                      channel pairs)                       token pairs)

``amx`` is what vLLM picks for bf16 caches on processors with AMX (Intel Sapphire Rapids and
later) and blocks of a multiple of 32 tokens; its layout was read off vLLM 0.32's buffers
against the model's own cache (layer 0's V equal in every scalar). Other ISAs (``vec16``,
``neon``, ...) and fp8 caches under ``amx`` are refused until their layout is checked.

vLLM's GPU attention backends (``GPU_BACKENDS``: FlashAttention, FlashInfer, Triton) read a
block's token ``n`` of head ``h`` as ``[K (D elements) | V (D elements)]``: the layer's buffer
is the same logical ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` tensor, ``[B, H, N,
C]`` in vLLM 0.32's terms (``vllm.v1.kv_cache_layout.KVCacheLayout``, RFC 42082), whose strides
follow the engine's resolved layout: any permutation of blocks, heads and tokens (``LBHNC``,
``LBNHC``, ``LHBNC``, and the cross-layer ``BLHNC``, ``BLNHC``, ``BHLNC``, where a block of
every layer is one run of memory), the content always innermost. Reads and writes go through
the tensor's own strides (one gather per request and layer on the buffer's device, then one
copy to pinned host memory; back the same way), so every such layout is read alike. Where
vLLM splits a block into kernel blocks (``block_size`` a multiple of the buffer's third
dimension), block ``i`` is kernel blocks ``i * r .. i * r + r - 1``.

Tests: the CPU kinds against vLLM's CPU engine (``tests/integrations/test_vllm.py``); the GPU kind against
buffers vLLM's own ``create_kv_cache_views`` lays out in every ``KVCacheLayout``, on CPU
tensors (``tests/integrations/test_paged_gpu.py``; not yet run on a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._speckv import SpeckvError

CPU = "cpu"
CPU_AMX = "cpu-amx"
GPU = "gpu"
# vLLM GPU attention backends (``AttentionBackend.get_name()``) whose blocks are the GPU kind
GPU_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
# platforms whose engines run those backends
GPU_PLATFORMS = ("cuda",)
# vLLM CPU attention ISA -> the layout its kernels keep blocks in
CPU_ISAS = {"vec": CPU, "amx": CPU_AMX}
# the tiles of the amx layout (module docs)
_TILE = 16


class UnsupportedLayoutError(SpeckvError):
    """A paged KV buffer in a layout speckv does not read (the message names its shape)."""


@dataclass(frozen=True)
class PagedLayout:
    """How one engine lays out a layer's paged buffer (``kind``) and its sizes."""

    kind: str
    block_size: int
    kv_heads: int
    head_dim: int
    # tokens per block of the buffer's kernel (the GPU kind: a divisor of block_size)
    kernel_block: int = 0

    @property
    def _split(self) -> int:
        """Kernel blocks per block (1 but where vLLM splits a block for its kernels)."""
        return self.block_size // self.kernel_block if self.kind == GPU else 1

    @classmethod
    def detect(
        cls,
        buffer: torch.Tensor,
        *,
        platform: str,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        isa: str = "vec",
        backend: str = "",
    ) -> PagedLayout:
        """The layout of ``buffer`` (one layer's paged cache) on ``platform`` ("cpu", "cuda",
        ...) whose attention kernels are ``isa`` (vLLM's CPU backend: ``layer.isa``) or
        ``backend`` (a GPU platform's: ``AttentionBackend.get_name()``), given the engine's block
        size and the model's heads; ``UnsupportedLayoutError`` for any layout not listed in the
        module docs."""
        shape = tuple(buffer.shape)
        if platform in GPU_PLATFORMS:
            return cls._detect_gpu(buffer, platform, backend, block_size, kv_heads, head_dim)
        if platform != CPU or len(shape) != 4 or shape[1:] != (kv_heads, block_size, 2 * head_dim):
            raise UnsupportedLayoutError(
                f"paged KV buffer of shape {list(shape)} ({buffer.dtype}) on {platform!r}: speckv reads vLLM's CPU "
                f"layout [num_blocks, {kv_heads} kv_heads, {block_size} block_size, {2 * head_dim} = 2 x head_dim] only"
            )
        kind = CPU_ISAS.get(isa)
        if kind is None:
            raise UnsupportedLayoutError(
                f"vLLM CPU attention ISA {isa!r}: speckv reads the blocks of {sorted(CPU_ISAS)} only "
                "(another kernel lays a block out otherwise)"
            )
        if kind == CPU_AMX and (buffer.element_size() != 2 or block_size % _TILE or head_dim % _TILE or head_dim % 2):
            raise UnsupportedLayoutError(
                f"vLLM CPU attention ISA 'amx' with {buffer.dtype} blocks of {block_size} tokens x {head_dim}: "
                "speckv reads amx blocks of 16-bit caches, block size and head size multiples of 16"
            )
        return cls(kind, block_size, kv_heads, head_dim)

    @classmethod
    def _detect_gpu(
        cls, buffer: torch.Tensor, platform: str, backend: str, block_size: int, kv_heads: int, head_dim: int
    ) -> PagedLayout:
        """``detect`` on a GPU platform (the GPU kind's checks, module docs)."""
        if backend not in GPU_BACKENDS:
            raise UnsupportedLayoutError(
                f"vLLM attention backend {backend!r} on {platform!r}: speckv reads the blocks of "
                f"{', '.join(GPU_BACKENDS)} only (another backend lays a block out otherwise)"
            )
        shape = tuple(buffer.shape)
        kernel = shape[2] if len(shape) == 4 else 0
        if (
            len(shape) != 4
            or shape[1] != kv_heads
            or shape[3] != 2 * head_dim
            or kernel == 0
            or block_size % kernel
            or buffer.stride(3) != 1
        ):
            raise UnsupportedLayoutError(
                f"paged KV buffer of shape {list(shape)}, strides {list(buffer.stride())} ({buffer.dtype}) under "
                f"{backend} on {platform!r}: speckv reads [num_blocks, {kv_heads} kv_heads, tokens per kernel block "
                f"dividing {block_size}, {2 * head_dim} = K and V of {head_dim}] with the content innermost"
            )
        return cls(GPU, block_size, kv_heads, head_dim, kernel)

    def _kernel_ids(self, block_ids: Sequence[int], device: torch.device) -> torch.Tensor:
        """The buffer's first-dimension indices of blocks ``block_ids`` (their kernel blocks, in
        order, for the GPU kind), on ``device``."""
        r = self._split
        ids = [i * r + j for i in block_ids for j in range(r)]
        return torch.as_tensor(ids, dtype=torch.long).to(device)

    def read(self, buffer: torch.Tensor, block_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks ``block_ids`` of ``buffer`` as ``(K, V)``, each ``[1, kv_heads, len(block_ids) *
        block_size, head_dim]``, in the buffer's dtype (copies)."""
        blocks = self.copy_blocks(buffer, block_ids)
        host_ready(buffer.device)
        k, v = self.split(blocks.numpy())
        return torch.from_numpy(k).view(buffer.dtype), torch.from_numpy(v).view(buffer.dtype)

    def copy_blocks(self, buffer: torch.Tensor, block_ids: Sequence[int]) -> torch.Tensor:
        """Blocks ``block_ids`` of ``buffer`` copied out as they lie, their bits as integers
        (``[n, kv_heads, block_size, 2 * head_dim]``; the GPU kind: its kernel blocks, ``[n *
        r, kv_heads, block_size / r, 2 * head_dim]``), on the host: the one copy an engine's
        step pays to store them; ``split`` turns it into ``(K, V)`` later, on another thread.
        From a GPU: one gather on the device, then one copy into pinned host memory queued on
        the current stream (``host_ready`` before reading it)."""
        blocks = _bits(buffer).index_select(0, self._kernel_ids(block_ids, buffer.device))
        if blocks.device.type == CPU:
            return blocks
        host = torch.empty(blocks.shape, dtype=blocks.dtype, pin_memory=True)
        host.copy_(blocks, non_blocking=True)
        return host

    def split(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``copy_blocks``' output (as numpy) as ``(K, V)`` ``[1, kv_heads, n * block_size,
        head_dim]`` C-contiguous arrays of the same integers (numpy alone: no torch thread pool
        on the saver's thread)."""
        b, d = self.block_size, self.head_dim
        n, h = blocks.shape[0], blocks.shape[1]
        if self.kind == GPU:
            return _tokens(blocks[..., :d]), _tokens(blocks[..., d:])  # K, V: [n * r, H, B / r, D]
        flat = blocks.reshape(n, h, 2 * b * d)
        if self.kind == CPU_AMX:
            t = _TILE
            # K [B/16][D/2][16][2] -> [B/16][16][D/2][2]; V [D/16][B/2][16][2] -> [B/2][2][D/16][16]
            k = flat[:, :, : d * b].reshape(n, h, b // t, d // 2, t, 2).transpose(0, 1, 2, 4, 3, 5)
            v = flat[:, :, d * b :].reshape(n, h, d // t, b // 2, t, 2).transpose(0, 1, 3, 5, 2, 4)
            k, v = k.reshape(n, h, b, d), v.reshape(n, h, b, d)
        else:
            k = flat[:, :, : d * b].reshape(n, h, d, b).transpose(0, 1, 3, 2)  # [n, H, B, D]
            v = flat[:, :, d * b :].reshape(n, h, b, d)
        return _tokens(k), _tokens(v)

    def pack(self, blocks: np.ndarray) -> np.ndarray:
        """Blocks in the stored shape ``[n, 2, kv_heads, block_size, head_dim]`` (K then V; bits
        as integers) laid out as the engine keeps them, ``[n, kv_heads, block_size, 2 *
        head_dim]`` (the GPU kind: ``copy_blocks``' kernel blocks) (numpy alone: a loader thread
        stays out of torch's thread pool; the inverse of ``split``, block by block)."""
        b, d, h = self.block_size, self.head_dim, self.kv_heads
        n = blocks.shape[0]
        if blocks.shape[1:] != (2, h, b, d):
            raise ValueError(f"blocks: expected [n, 2, {h}, {b}, {d}], got {list(blocks.shape)}")
        k, v = blocks[:, 0], blocks[:, 1]  # [n, H, B, D]
        if self.kind == GPU:
            r, kb = self._split, self.kernel_block

            def kernel_blocks(x: np.ndarray) -> np.ndarray:  # [n, H, B, D] -> [n * r, H, B / r, D]
                return x.reshape(n, h, r, kb, d).transpose(0, 2, 1, 3, 4).reshape(n * r, h, kb, d)

            return np.concatenate([kernel_blocks(k), kernel_blocks(v)], axis=3)
        if self.kind == CPU_AMX:
            t = _TILE
            kt = k.reshape(n, h, b // t, t, d // 2, 2).transpose(0, 1, 2, 4, 3, 5)
            vt = v.reshape(n, h, b // 2, 2, d // t, t).transpose(0, 1, 4, 2, 5, 3)
        else:
            kt, vt = k.transpose(0, 1, 3, 2), v
        out = np.empty((n, h, 2 * b * d), blocks.dtype)
        out[:, :, : b * d] = kt.reshape(n, h, b * d)
        out[:, :, b * d :] = vt.reshape(n, h, b * d)
        return out.reshape(n, h, b, 2 * d)

    def put(self, buffer: torch.Tensor, block_ids: Sequence[int], packed: np.ndarray) -> None:
        """Writes ``pack``'s output into blocks ``block_ids`` of ``buffer`` (numpy alone on the
        host; to a GPU's buffer, one copy from pinned memory and one scatter on the device,
        returning once they are done: a loader thread's writes must land before the forward
        pass reads the layer, whatever stream that runs on)."""
        bits = _bits(buffer)
        want = (len(block_ids) * self._split, *bits.shape[1:])
        if packed.shape != want or packed.dtype != np.dtype(str(bits.dtype).removeprefix("torch.")):
            raise ValueError(f"packed: expected {list(want)} {bits.dtype}, got {list(packed.shape)} {packed.dtype}")
        if buffer.device.type == CPU:
            words = bits.numpy()
            words[self._kernel_ids(block_ids, buffer.device).numpy()] = packed
            return
        source = torch.from_numpy(np.ascontiguousarray(packed)).pin_memory().to(buffer.device, non_blocking=True)
        bits.index_copy_(0, self._kernel_ids(block_ids, buffer.device), source)
        host_ready(buffer.device)

    def write(self, buffer: torch.Tensor, block_ids: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes ``(K, V)`` (``[1, kv_heads, len(block_ids) * block_size, head_dim]``, the
        buffer's dtype) into blocks ``block_ids`` of ``buffer``."""
        b, d = self.block_size, self.head_dim
        n, h = len(block_ids), self.kv_heads
        for name, x in (("K", k), ("V", v)):
            if tuple(x.shape) != (1, h, n * b, d) or x.dtype != buffer.dtype:
                raise ValueError(
                    f"{name}: expected [1, {h}, {n * b}, {d}] {buffer.dtype}, got {list(x.shape)} {x.dtype}"
                )

        def blocks(x: torch.Tensor) -> torch.Tensor:  # [1, H, n * B, D] -> [n, H, B, D]
            return x.reshape(h, n, b, d).permute(1, 0, 2, 3)

        ids = self._kernel_ids(block_ids, buffer.device)
        if self.kind == GPU:
            kb = self.kernel_block
            # [1, H, n * B, D] -> [n * r, H, B / r, D]: kernel blocks are consecutive tokens
            kt, vt = (x.reshape(h, n * self._split, kb, d).permute(1, 0, 2, 3) for x in (k, v))
            data = torch.cat([_bits(kt), _bits(vt)], dim=3).to(buffer.device)
            _bits(buffer).index_copy_(0, ids, data)
            return
        if self.kind == CPU_AMX:
            t = _TILE
            kt = blocks(k).reshape(n, h, b // t, t, d // 2, 2).permute(0, 1, 2, 4, 3, 5)
            vt = blocks(v).reshape(n, h, b // 2, 2, d // t, t).permute(0, 1, 4, 2, 5, 3)
        else:
            kt, vt = blocks(k).transpose(2, 3), blocks(v)
        data = torch.cat([_bits(kt.reshape(n, h, d * b)), _bits(vt.reshape(n, h, b * d))], dim=2)
        _bits(buffer).index_copy_(0, ids, data.reshape(n, h, b, 2 * d))


def host_ready(device: torch.device) -> None:
    """Waits for the copies ``copy_blocks`` and ``put`` queued on ``device`` (nothing on the
    host): the whole device, since the engine's forward pass may queue them on a stream of its
    own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tokens(x: np.ndarray) -> np.ndarray:
    """``[n, H, B, D]`` blocks as ``[1, H, n * B, D]`` tokens (C-contiguous)."""
    n, h, b, d = x.shape
    return np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(1, h, n * b, d)


_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as integers of its size (copies and index kernels for every dtype:
    torch has no ``index_copy_`` for fp8)."""
    return t.view(_INTEGERS[t.element_size()])


__all__ = [
    "CPU",
    "CPU_AMX",
    "CPU_ISAS",
    "GPU",
    "GPU_BACKENDS",
    "GPU_PLATFORMS",
    "PagedLayout",
    "UnsupportedLayoutError",
    "host_ready",
]
