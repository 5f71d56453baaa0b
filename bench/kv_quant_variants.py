"""Variants of the int4 scheme measured before any is built: which of keys and values costs
the fidelity, and what a finer value group or pre-RoPE keys would buy.

A variant gives an entry back in the model's dtype after a quantize / dequantize round trip
(float32 in between, one rounding), so it is injected by the plain path: the fidelity of the
numbers a stored form would give, without its file format or load kernel. ``bench kvquant
--schemes int4,sim-int4-v32`` measures one beside the product's scheme in the same run and
engine; each variant's requests carry a cache salt of their own (its entries share the keys of
the model's, so vLLM's prefix cache would otherwise serve one for the other).

* ``sim-int4``: the product's int4 as a round trip (checks the simulation against the real).
* ``sim-int4-minmax``: int4 with min-max ranges, no clipping or refit (the scheme before).
* ``sim-int4-k`` / ``sim-int4-v``: only the keys / only the values quantized.
* ``sim-int4-v32``: values in groups of 32 channels (twice the value scales).
* ``sim-int4-pre``: keys quantized before RoPE (rotated back from their positions, rotated
  again after expanding, as KVQuant does).
* ``sim-int4-v32-pre``: both.
"""

from __future__ import annotations

import torch

from inferscale_core.kvstore.quant import INT4_GROUP, int4_fit
from inferscale_core.rope import RopeSpec, shift
from inferscale_core.types import FactKV

PREFIX = "sim-"


def is_variant(scheme: str) -> bool:
    return scheme.startswith(PREFIX)


def names() -> tuple[str, ...]:
    return tuple(PREFIX + name for name in _VARIANTS)


def check(scheme: str) -> str:
    if scheme.removeprefix(PREFIX) not in _VARIANTS or not is_variant(scheme):
        raise ValueError(f"unknown variant {scheme!r}; known: {', '.join(names())}")
    return scheme


def round_trip(entry: FactKV, scheme: str, rope: RopeSpec | None) -> FactKV:
    """``entry`` (plain) as ``scheme`` gives it back, in the entry's dtype."""
    keys, values = _VARIANTS[check(scheme).removeprefix(PREFIX)]
    k, v = entry.k.float(), entry.v.float()  # [L, T, H, D]
    if keys == "pre":
        if rope is None:
            raise ValueError(f"{scheme} needs the model's RoPE")
        at = torch.arange(k.shape[1], dtype=torch.int64) + entry.origin
        k = shift(_keys(shift(k, -at, rope), "fit"), at, rope)
    else:
        k = _keys(k, keys)
    v = _values(v, values)
    dtype = entry.k.dtype
    return FactKV(
        entry.key, list(entry.token_ids), k.to(dtype), v.to(dtype), entry.fingerprint, entry.origin
    )


# ---- helpers ----
def _expand(fit: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    codes, scale, low = fit
    return codes.float() * scale.float() + low.float()


def _keys(k: torch.Tensor, how: str) -> torch.Tensor:
    if how == "exact":
        return k
    minmax = {"clips": (), "refits": 0} if how == "minmax" else {}
    return _expand(int4_fit(k, dim=1, **minmax))  # per channel over the tokens


def _values(v: torch.Tensor, how: str) -> torch.Tensor:
    if how == "exact":
        return v
    layers, tokens, heads, dim = v.shape
    group = min(32 if how == "g32" else INT4_GROUP, dim)
    grouped = v.reshape(layers, tokens, heads, dim // group, group)
    minmax = {"clips": (), "refits": 0} if how == "minmax" else {}
    return _expand(int4_fit(grouped, dim=-1, **minmax)).reshape(v.shape)


_VARIANTS: dict[str, tuple[str, str]] = {  # name: (keys, values)
    "int4": ("fit", "fit"),
    "int4-minmax": ("minmax", "minmax"),
    "int4-k": ("fit", "exact"),
    "int4-v": ("exact", "fit"),
    "int4-v32": ("fit", "g32"),
    "int4-pre": ("pre", "fit"),
    "int4-v32-pre": ("pre", "g32"),
}
