"""Plain torch indexing into each paged layout, writing: the reference the fused kernel is
checked against (read back with the product's ``paged_layouts.gather_kv``)."""

from __future__ import annotations

import torch

from inferscale_core.vllm_plugin.paged_layouts import (
    PagedLayout,
    UnknownLayoutError,
    _block_offset,
    gather_kv,
)

__all__ = ["gather_kv", "scatter_kv"]


def scatter_kv(
    cache: torch.Tensor,  # one layer's paged cache in ``layout``
    layout: PagedLayout,
    k: torch.Tensor,  # [tokens, kv_heads, head_dim] post-RoPE, cache dtype
    v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    slots: torch.Tensor,  # [tokens] int64
    block_size: int,
) -> None:
    """Write ``k``/``v`` into ``cache`` at ``slots`` (in place)."""
    blocks, offsets = _block_offset(slots, block_size)
    head_dim = k.shape[-1]
    if layout is PagedLayout.FUSED_HEADS:
        # Advanced indices split by a slice put the token dim first: [tokens, kv_heads, 2 * hd].
        cache[blocks, :, offsets] = torch.cat([k, v], dim=-1)
        assert cache.shape[-1] == 2 * head_dim
    elif layout is PagedLayout.KV_FIRST:
        cache[0, blocks, offsets] = k  # [tokens, kv_heads, head_dim]
        cache[1, blocks, offsets] = v
    elif layout is PagedLayout.BLOCKS_FIRST:
        cache[blocks, 0, offsets] = k
        cache[blocks, 1, offsets] = v
    else:  # pragma: no cover - Enum is closed
        raise UnknownLayoutError(str(layout))
