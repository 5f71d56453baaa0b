"""``bench kvquant``'s simulated int4 variants (bench/kv_quant_variants.py): each gives back
what its stored form would, in the entry's dtype."""

import pytest
import torch

from bench import kv_quant_variants as variants
from inferscale_core.kvstore.quant import dequantize, quantize
from inferscale_core.rope import RopeSpec, shift
from inferscale_core.types import FactKV

SPEC = RopeSpec(64, 64, tuple(1.0 / 10000 ** (i / 32) for i in range(32)), 1.0, True, "default")


def _entry(dtype: torch.dtype = torch.float32) -> FactKV:
    gen = torch.Generator().manual_seed(0)
    pre = torch.randn(2, 30, 2, 64, generator=gen)
    pre[..., 5] += 20.0  # an outlier channel before RoPE, as KVQuant finds in real keys
    at = torch.arange(30, dtype=torch.int64) + 11
    k = shift(pre, at, SPEC)
    v = torch.randn(2, 30, 2, 64, generator=gen)
    return FactKV("fact-x", list(range(30)), k.to(dtype), v.to(dtype), "fp", origin=11)


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).square().sum() / b.float().square().sum())


def test_the_products_int4_round_trip_is_the_product():
    entry = _entry()
    sim = variants.round_trip(entry, "sim-int4", SPEC)
    real = dequantize(quantize(entry, "int4"), torch.float32)
    assert torch.allclose(sim.k, real.k, atol=1e-5) and torch.allclose(sim.v, real.v, atol=1e-5)
    assert sim.quant is None and sim.k.dtype == torch.float32


def test_each_variant_changes_what_it_says_and_nothing_else():
    entry = _entry(torch.bfloat16)
    keys_only = variants.round_trip(entry, "sim-int4-k", SPEC)
    values_only = variants.round_trip(entry, "sim-int4-v", SPEC)
    assert torch.equal(keys_only.v, entry.v) and not torch.equal(keys_only.k, entry.k)
    assert torch.equal(values_only.k, entry.k) and not torch.equal(values_only.v, entry.v)
    assert keys_only.k.dtype == torch.bfloat16 and keys_only.origin == 11
    product = variants.round_trip(entry, "sim-int4", SPEC)
    four_bit = variants.round_trip(entry, "sim-int4-k4", SPEC)
    minmax = variants.round_trip(entry, "sim-int4-minmax", SPEC)
    pre = variants.round_trip(entry, "sim-int4-pre", SPEC)
    assert _error(product.k, entry.k) < _error(four_bit.k, entry.k)  # 8-bit wide channels
    assert torch.equal(product.v, four_bit.v)
    assert _error(four_bit.v, entry.v) < _error(minmax.v, entry.v)  # fitted ranges
    assert _error(pre.k, entry.k) < _error(four_bit.k, entry.k)  # the outlier channel, pre-RoPE
    assert torch.equal(pre.v, four_bit.v)


def test_unknown_variants_and_pre_rope_without_a_rope_are_refused():
    with pytest.raises(ValueError, match="unknown variant 'sim-int8'"):
        variants.round_trip(_entry(), "sim-int8", SPEC)
    with pytest.raises(ValueError, match="needs the model's RoPE"):
        variants.round_trip(_entry(), "sim-int4-pre", None)
    assert "sim-int4-k4" in variants.names() and not variants.is_variant("int4")
