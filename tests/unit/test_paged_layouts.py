"""vLLM 0.26 GPU cache layouts, written and read with torch indexing on CPU tensors."""

import pytest
import torch

from inferscale_core.load_plan import slot_mapping
from inferscale_core.vllm_plugin.paged_layouts import (
    PagedLayout,
    UnknownLayoutError,
    detect_layout,
)
from tests.support.paged_reference import gather_kv, scatter_kv

BLOCKS, BS, H, D = 6, 16, 8, 128


def _fused_heads_as_seen_on_h200() -> torch.Tensor:
    # Logical (blocks, kv_heads, block_size, 2*D) with memory order (blocks, block_size, heads, 2D):
    # stride (32768, 256, 2048, 1) for H=8, D=128, bs=16, exactly as vLLM 0.26 FA3 registered it.
    storage = torch.zeros(BLOCKS, BS, H, 2 * D, dtype=torch.bfloat16)
    cache = storage.permute(0, 2, 1, 3)
    assert cache.stride() == (32768, 256, 2048, 1)
    return cache


LAYOUTS = {
    PagedLayout.FUSED_HEADS: _fused_heads_as_seen_on_h200,
    PagedLayout.KV_FIRST: lambda: torch.zeros(2, BLOCKS, BS, H, D, dtype=torch.bfloat16),
    PagedLayout.BLOCKS_FIRST: lambda: torch.zeros(BLOCKS, 2, BS, H, D, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scatter_puts_token_t_at_its_block_and_offset(layout):
    cache = LAYOUTS[layout]()
    assert detect_layout(cache, BS, H, D) is layout
    block_ids = [4, 1, 5]  # the request's blocks, in order
    start, end = 10, 40  # positions crossing two block boundaries
    slots = torch.tensor(slot_mapping(block_ids, BS, start, end))
    k = torch.randn(end - start, H, D).to(torch.bfloat16)  # [tokens, kv_heads, head_dim]
    v = torch.randn(end - start, H, D).to(torch.bfloat16)
    scatter_kv(cache, layout, k, v, slots, BS)

    got_k, got_v = gather_kv(cache, layout, slots, BS)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    # The documented address of position p: [block_ids[p // bs], :, p % bs], K first.
    p = 33
    t = p - start
    block, offset = block_ids[p // BS], p % BS
    if layout is PagedLayout.FUSED_HEADS:
        assert torch.equal(cache[block, :, offset, :D], k[t])
        assert torch.equal(cache[block, :, offset, D:], v[t])
    elif layout is PagedLayout.KV_FIRST:
        assert torch.equal(cache[0, block, offset], k[t]) and torch.equal(
            cache[1, block, offset], v[t]
        )
    else:
        assert torch.equal(cache[block, 0, offset], k[t]) and torch.equal(
            cache[block, 1, offset], v[t]
        )
    # Nothing else was touched.
    written = torch.zeros(BLOCKS * BS, dtype=torch.bool)
    written[slots] = True
    untouched = torch.arange(BLOCKS * BS)[~written]
    rest_k, rest_v = gather_kv(cache, layout, untouched, BS)
    assert not rest_k.any() and not rest_v.any()


def test_unknown_and_ambiguous_layouts_are_refused():
    with pytest.raises(UnknownLayoutError, match="matches no known layout"):
        detect_layout(torch.zeros(4, BS, H, D), BS, H, D)
    with pytest.raises(UnknownLayoutError, match="ambiguous"):
        detect_layout(torch.zeros(2, 2, BS, H, D), BS, H, D)
