"""``bench kvquant``'s key measurement: post-RoPE (as stored) against pre-RoPE quantization."""

import torch

from bench.kv_quant import key_rope_error
from inferscale_core.rope import RopeSpec, shift
from inferscale_core.types import FactKV


def _entry(pre: torch.Tensor, spec: RopeSpec, origin: int) -> FactKV:
    """An entry whose stored keys are ``pre`` rotated at positions origin.."""
    at = torch.arange(pre.shape[1], dtype=torch.int64) + origin
    k = shift(pre, at, spec)
    return FactKV("f", list(range(pre.shape[1])), k, torch.randn_like(k), "fp", origin)


def test_keys_with_a_constant_channel_quantize_better_before_rope():
    spec = RopeSpec(16, 16, tuple(1.0 / 10000 ** (i / 8) for i in range(8)), 1.0, True, "default")
    gen = torch.Generator().manual_seed(0)
    pre = torch.randn(2, 40, 2, 16, generator=gen)
    pre[..., 3] += 30.0  # an outlier channel, constant over tokens before RoPE (KVQuant's case)
    errors = key_rope_error([_entry(pre, spec, origin=7)], spec, ["fp8", "int4"])
    for scheme in ("fp8", "int4"):
        post, before = errors[scheme]["post_rope"], errors[scheme]["pre_rope"]
        assert 0 < before < post, (scheme, errors)  # RoPE spreads the outlier over two channels


def test_without_outliers_both_orders_lose_alike():
    spec = RopeSpec(16, 16, tuple(1.0 / 10000 ** (i / 8) for i in range(8)), 1.0, True, "default")
    gen = torch.Generator().manual_seed(1)
    errors = key_rope_error(
        [_entry(torch.randn(2, 40, 2, 16, generator=gen), spec, origin=0)], spec, ["int4"]
    )
    post, before = errors["int4"]["post_rope"], errors["int4"]["pre_rope"]
    assert 0.5 < before / post < 2.0, errors
