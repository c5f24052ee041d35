"""vLLM's paged KV buffers: whole blocks read out as a model cache's ``(K, V)`` and written back.

A serving engine keeps each layer's cache in fixed-size blocks of tokens; a request owns a list
of block ids. speckv codes caches as per-layer ``[1, kv_heads, tokens, head_dim]`` tensors, so
the connector reads a request's blocks into that shape and writes decoded ones back, bit for
bit (pure copies and views: no arithmetic touches a value).

Layouts (``PagedLayout``; a buffer of another shape is refused with ``UnsupportedLayoutError``
naming it):

``cpu`` (vLLM's CPU attention backend), per layer ``[num_blocks, kv_heads, block_size,
2 * head_dim]``; inside one block and head, the keys transposed, then the values::

    offset (elements)            size                   content
    0                            head_dim * block_size  K as [head_dim][block_size]
    head_dim * block_size        block_size * head_dim  V as [block_size][head_dim]

GPU backends (``[2, num_blocks, block_size, kv_heads, head_dim]`` and others) follow when they
can be tested on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._speckv import SpeckvError

CPU = "cpu"


class UnsupportedLayoutError(SpeckvError):
    """A paged KV buffer in a layout speckv does not read (the message names its shape)."""


@dataclass(frozen=True)
class PagedLayout:
    """How one engine lays out a layer's paged buffer (``kind``) and its sizes."""

    kind: str
    block_size: int
    kv_heads: int
    head_dim: int

    @classmethod
    def detect(
        cls, buffer: torch.Tensor, *, platform: str, block_size: int, kv_heads: int, head_dim: int
    ) -> PagedLayout:
        """The layout of ``buffer`` (one layer's paged cache) on ``platform`` ("cpu", "cuda",
        ...), given the engine's block size and the model's heads; ``UnsupportedLayoutError``
        for any layout not listed in the module docs."""
        shape = tuple(buffer.shape)
        if platform == CPU and len(shape) == 4 and shape[1:] == (kv_heads, block_size, 2 * head_dim):
            return cls(CPU, block_size, kv_heads, head_dim)
        raise UnsupportedLayoutError(
            f"paged KV buffer of shape {list(shape)} ({buffer.dtype}) on {platform!r}: speckv reads vLLM's CPU layout "
            f"[num_blocks, {kv_heads} kv_heads, {block_size} block_size, {2 * head_dim} = 2 x head_dim] only"
        )

    def read(self, buffer: torch.Tensor, block_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks ``block_ids`` of ``buffer`` as ``(K, V)``, each ``[1, kv_heads, len(block_ids) *
        block_size, head_dim]``, in the buffer's dtype (copies)."""
        b, d = self.block_size, self.head_dim
        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        blocks = _bits(buffer).index_select(0, ids).view(buffer.dtype)  # [n, H, B, 2D]
        n, h = blocks.shape[0], blocks.shape[1]
        flat = blocks.reshape(n, h, 2 * b * d)
        k = flat[:, :, : d * b].reshape(n, h, d, b).transpose(2, 3)  # [n, H, B, D]
        v = flat[:, :, d * b :].reshape(n, h, b, d)

        def tokens(t: torch.Tensor) -> torch.Tensor:  # [n, H, B, D] -> [1, H, n * B, D]
            return t.permute(1, 0, 2, 3).reshape(1, h, n * b, d).contiguous()

        return tokens(k), tokens(v)

    def write(self, buffer: torch.Tensor, block_ids: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes ``(K, V)`` (``[1, kv_heads, len(block_ids) * block_size, head_dim]``, the
        buffer's dtype) into blocks ``block_ids`` of ``buffer``."""
        b, d = self.block_size, self.head_dim
        n, h = len(block_ids), self.kv_heads
        for name, t in (("K", k), ("V", v)):
            if tuple(t.shape) != (1, h, n * b, d) or t.dtype != buffer.dtype:
                raise ValueError(
                    f"{name}: expected [1, {h}, {n * b}, {d}] {buffer.dtype}, got {list(t.shape)} {t.dtype}"
                )

        def blocks(t: torch.Tensor) -> torch.Tensor:  # [1, H, n * B, D] -> [n, H, B, D]
            return t.reshape(h, n, b, d).permute(1, 0, 2, 3)

        kt = _bits(blocks(k).transpose(2, 3).reshape(n, h, d * b))
        vt = _bits(blocks(v).reshape(n, h, b * d))
        data = torch.cat([kt, vt], dim=2).reshape(n, h, b, 2 * d)
        _bits(buffer).index_copy_(0, torch.as_tensor(list(block_ids), dtype=torch.long), data)


_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as integers of its size (copies and index kernels for every dtype:
    torch has no ``index_copy_`` for fp8)."""
    return t.view(_INTEGERS[t.element_size()])


__all__ = ["CPU", "PagedLayout", "UnsupportedLayoutError"]
