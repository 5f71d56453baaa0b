"""Variants of the int4 scheme measured before any is built: which of keys and values costs
the fidelity, and what a stored form would buy.

A variant gives an entry back in the model's dtype after a quantize / dequantize round trip
(float32 in between, one rounding), so it is injected by the plain path: the fidelity of the
numbers a stored form would give, without its file format or load kernel. ``bench kvquant
--schemes int4,sim-int4-k4`` measures one beside the product's scheme in the same run and
engine; each variant's requests carry a cache salt of their own (its entries share the keys of
the model's, so vLLM's prefix cache would otherwise serve one for the other).

* ``sim-int4``: the product's int4 as a round trip (checks the simulation against the real).
* ``sim-int4-k4``: every key channel in 4 bits (int4 before its 8-bit key channels).
* ``sim-int4-minmax``: 4-bit keys, min-max ranges, no refit (int4 before the fitted ranges).
* ``sim-int4-k`` / ``sim-int4-v``: only the keys / only the values quantized (4-bit keys).
* ``sim-int4-pre``: 4-bit keys quantized before RoPE (rotated back from their positions,
  rotated again after expanding, as KVQuant does).

Measured on an H100 (2026-12-06, SmolLM2 bf16, 200 LoCoMo questions, k = 5 / 20 / 50; raw in
docs/log/results): keys cost the agreement (keys alone: top-1 97.4 / 97.0 / 96.6%, values alone
97.3 / 97.6 / 98.0%); value groups of 32, pre-RoPE keys and the first two layers' keys exact
moved nothing beyond the noise; the widest eighth of each head's key channels in 8 bits halved
the KL and brought top-1 to 97.1-97.7%: the product's int4 since.
"""

from __future__ import annotations

import torch

from inferscale_core.kvstore.quant import INT4_GROUP, dequantize, int4_fit, quantize
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
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the fits' arithmetic
    k, v = entry.k.to(device).float(), entry.v.to(device).float()  # [L, T, H, D]
    if keys == "pre":
        if rope is None:
            raise ValueError(f"{scheme} needs the model's RoPE")
        at = torch.arange(k.shape[1], dtype=torch.int64) + entry.origin
        k = shift(_keys(shift(k, -at, rope), "fit"), at, rope)
    else:
        k = _keys(k, keys)
    v = _values(v, values)  # the product's groups
    dtype, home = entry.k.dtype, entry.k.device
    k, v = k.to(home, dtype), v.to(home, dtype)
    return FactKV(entry.key, list(entry.token_ids), k, v, entry.fingerprint, entry.origin)


# ---- helpers ----
def _expand(fit: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    codes, scale, low = fit
    return codes.float() * scale.float() + low.float()


def _keys(k: torch.Tensor, how: str) -> torch.Tensor:
    if how == "exact":
        return k
    if how == "product":  # 4-bit codes, the widest channels in 8 bits: the store's own
        tokens = list(range(k.shape[1]))
        return dequantize(quantize(FactKV("sim", tokens, k, k, ""), "int4"), torch.float32).k
    minmax = {"clips": (), "refits": 0} if how == "minmax" else {}
    return _expand(int4_fit(k, dim=1, **minmax))  # per channel over the tokens


def _values(v: torch.Tensor, how: str) -> torch.Tensor:
    if how == "exact":
        return v
    layers, tokens, heads, dim = v.shape
    group = min(INT4_GROUP, dim)
    grouped = v.reshape(layers, tokens, heads, dim // group, group)
    minmax = {"clips": (), "refits": 0} if how == "minmax" else {}
    return _expand(int4_fit(grouped, dim=-1, **minmax)).reshape(v.shape)


_VARIANTS: dict[str, tuple[str, str]] = {  # name: (keys, values)
    "int4": ("product", "fit"),
    "int4-k4": ("fit", "fit"),
    "int4-minmax": ("minmax", "minmax"),
    "int4-k": ("fit", "exact"),
    "int4-v": ("exact", "fit"),
    "int4-pre": ("pre", "fit"),
}
