"""Paged KV-cache layouts of vLLM's GPU attention backends, as the fused kernel addresses them.

For the layouts listed here the fused injection kernel writes the cache through raw element
offsets (:func:`cache_geometry`) and captures read spans back with :func:`gather_kv`; any
other layout is written through the backend's own ``do_kv_cache_update``. Pure torch, no vLLM
import, so every layout is tested on CPU tensors (against the plain-indexing reference in
``tests/support/paged_reference.py``). Token ``t`` of a request lives in slot
``block_ids[t // block_size] * block_size + t % block_size``.

Layouts (logical shapes; strides may permute them):

``fused_heads``  ``[num_blocks, kv_heads, block_size, 2 * head_dim]``, K in ``[..., :head_dim]``
                 (vLLM 0.26 FLASH_ATTN / FLASHINFER / TRITON_ATTN, seen on the H200)
``kv_first``     ``[2, num_blocks, block_size, kv_heads, head_dim]`` (older FLASH_ATTN)
``blocks_first`` ``[num_blocks, 2, block_size, kv_heads, head_dim]`` (older FLASHINFER / TRITON)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


class PagedLayout(Enum):
    FUSED_HEADS = "fused_heads"
    KV_FIRST = "kv_first"
    BLOCKS_FIRST = "blocks_first"


class UnknownLayoutError(ValueError):
    """A cache tensor whose shape matches none of the layouts we can write safely."""


def detect_layout(
    cache: torch.Tensor, block_size: int, kv_heads: int, head_dim: int
) -> PagedLayout:
    """Which layout ``cache`` has, from its shape; :class:`UnknownLayoutError` if none fits."""
    shape = tuple(cache.shape)
    matches = []
    if len(shape) == 4 and shape[1:] == (kv_heads, block_size, 2 * head_dim):
        matches.append(PagedLayout.FUSED_HEADS)
    if len(shape) == 5 and shape[2:] == (block_size, kv_heads, head_dim):
        if shape[0] == 2:
            matches.append(PagedLayout.KV_FIRST)
        if shape[1] == 2:
            matches.append(PagedLayout.BLOCKS_FIRST)
    if len(matches) != 1:
        why = (
            "is ambiguous between " + ", ".join(m.value for m in matches)
            if matches
            else ("matches no known layout")
        )
        raise UnknownLayoutError(
            f"KV cache of shape {shape} {why} for block_size={block_size},"
            f" kv_heads={kv_heads}, head_dim={head_dim}; write through the backend's"
            " do_kv_cache_update instead"
        )
    return matches[0]


def _block_offset(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.div(slots, block_size, rounding_mode="floor"), slots % block_size  # [tokens] x2


def gather_kv(
    cache: torch.Tensor, layout: PagedLayout, slots: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read back K and V at ``slots``: each [tokens, kv_heads, head_dim]."""
    blocks, offsets = _block_offset(slots, block_size)
    if layout is PagedLayout.FUSED_HEADS:
        both = cache[blocks, :, offsets]  # [tokens, kv_heads, 2 * head_dim]
        head_dim = both.shape[-1] // 2
        return both[..., :head_dim], both[..., head_dim:]
    if layout is PagedLayout.KV_FIRST:
        return cache[0, blocks, offsets], cache[1, blocks, offsets]
    if layout is PagedLayout.BLOCKS_FIRST:
        return cache[blocks, 0, offsets], cache[blocks, 1, offsets]
    raise UnknownLayoutError(str(layout))  # pragma: no cover


@dataclass(frozen=True)
class CacheGeometry:
    """Where K element ``(slot, head, dim)`` of one layer lives, in elements from the cache's
    first element: ``(slot // block_size) * block_stride + (slot % block_size) * offset_stride
    + head * head_stride + dim * dim_stride``; its V element is ``v_offset`` further on."""

    block_size: int
    block_stride: int
    offset_stride: int
    head_stride: int
    dim_stride: int
    v_offset: int


def cache_geometry(cache: torch.Tensor, layout: PagedLayout, block_size: int) -> CacheGeometry:
    """The element arithmetic of ``cache`` (any strides) in ``layout``, for kernels that write
    it through raw pointers."""
    s = cache.stride()
    if layout is PagedLayout.FUSED_HEADS:  # [num_blocks, kv_heads, block_size, 2 * head_dim]
        return CacheGeometry(block_size, s[0], s[2], s[1], s[3], (cache.shape[3] // 2) * s[3])
    if layout is PagedLayout.KV_FIRST:  # [2, num_blocks, block_size, kv_heads, head_dim]
        return CacheGeometry(block_size, s[1], s[2], s[3], s[4], s[0])
    if layout is PagedLayout.BLOCKS_FIRST:  # [num_blocks, 2, block_size, kv_heads, head_dim]
        return CacheGeometry(block_size, s[0], s[2], s[3], s[4], s[1])
    raise UnknownLayoutError(str(layout))  # pragma: no cover - Enum is closed
