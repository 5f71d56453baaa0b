"""Compressed KV entries: fp8 (e4m3) and 4-bit codes with their scales, in torch (a CPU
expands int4 with the C kernel of :mod:`~inferscale_core.kvstore.int4_native` where it is built).

A fact's entry is ~45 KiB a token for SmolLM2 in fp32 and 128 KiB for the Llama-3.1-8B shape
in bf16; the store keeps most of it compressed (``kv_store_dtype``), and the connector
dequantizes where it writes the paged cache. Each tensor is quantized along the axis where its
outliers live (KIVI, KVQuant):

* keys per channel: one scale (and, for int4, one minimum) per ``(layer, head, channel)`` over
  the entry's tokens. Keys are stored post-RoPE at their origin; over one fact's ~50 positions
  a channel with an outlier keeps it (the slow-turning channels hold them), and the fast ones
  spread a pair's norm evenly over its two channels.
* values per token: one scale (and minimum) per ``(layer, token, head, group)``, a group being
  :data:`INT4_GROUP` channels of the head (fp8: the whole head).

fp8 is symmetric (absmax / 448, e4m3's largest normal); int4 asymmetric (``code * scale +
minimum``, codes 0..15, two a byte: channel ``c`` of the first half of the head in the low
nibble, ``c + head_dim / 2`` in the high one; each slice's range and step fitted for the least
squared error, :func:`int4_fit`). Scales are float32 for fp8 and float16 for int4
(the minimum in float16 too: its rounding, 2^-11 of it, stays below a code step).

Dequantizing computes in float32 and rounds once to the model's dtype. Entries of the system
prefix are never compressed (:func:`scheme_for`): the prefix is exact and shared by every
request.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inferscale_core.kvstore import int4_native
from inferscale_core.types import FactKV, KVQuant

SCHEMES = ("model", "fp8", "int4")
"""How an entry is stored: the model's own dtype (exact), fp8 e4m3 or 4-bit codes."""

INT4_GROUP = 64
"""Value channels sharing one int4 scale (a whole head where the head is smaller)."""

_FP8 = torch.float8_e4m3fn
_FP8_MAX = 448.0
_TINY = 1e-12  # a channel of zeros gets this scale, not 0 (no division by zero)
_TINY_HALF = 2.0**-24  # float16's smallest step: a fitted scale never rounds to 0
_CLIPS: tuple[float, ...] = ()  # int4 ranges tried besides min-max (see int4_fit)
_REFITS = 1  # least-squares refits of each range's step and offset
_EXACT_KINDS = ("prefix-",)  # keys (composer.entry_key) of entries kept in the model's dtype


def scheme_for(key: str, scheme: str) -> str:
    """The scheme an entry under ``key`` is stored in when the store's is ``scheme``: the
    system prefix stays exact."""
    return "model" if key.startswith(_EXACT_KINDS) else scheme


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"kv store dtype must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    return scheme


def scheme_of(entry: FactKV) -> str:
    return "model" if entry.quant is None else entry.quant.scheme


def quantize(entry: FactKV, scheme: str) -> FactKV:
    """``entry`` stored as ``scheme`` (an entry already in it is returned as it is; a
    compressed one is never compressed again from its codes: dequantize it first)."""
    check_scheme(scheme)
    if scheme == scheme_of(entry):
        return entry
    if entry.quant is not None:
        entry = dequantize(entry)
    if scheme == "model":
        return entry
    k = entry.k.float()  # [L, T, H, D]
    v = entry.v.float()  # [L, T, H, Dv]
    if scheme == "fp8":
        k_scale = _absmax(k, dim=1) / _FP8_MAX  # [L, 1, H, D]
        v_scale = _absmax(v, dim=3) / _FP8_MAX  # [L, T, H, 1]
        quant = KVQuant("fp8", entry.k.dtype, k.shape[-1], v.shape[-1], k_scale, v_scale)
        k_codes = (k / k_scale).clamp_(-_FP8_MAX, _FP8_MAX).to(_FP8)
        v_codes = (v / v_scale).clamp_(-_FP8_MAX, _FP8_MAX).to(_FP8)
    else:
        k_codes, k_scale, k_min, k_fine, k_slot = _int4_keys(k)
        v_codes, v_scale, v_min = _int4_groups(v)
        quant = KVQuant(
            "int4",
            entry.k.dtype,
            k.shape[-1],
            v.shape[-1],
            k_scale,
            v_scale,
            k_min,
            v_min,
            k_fine,
            k_slot,
        )
    return FactKV(
        entry.key, list(entry.token_ids), k_codes, v_codes, entry.fingerprint, entry.origin, quant
    )


def dequantize(
    entry: FactKV, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> FactKV:
    """``entry`` in plain tensors of ``dtype`` (default: the dtype it was encoded in) on
    ``device`` (default: where it is). Codes move before they expand: a compressed entry
    crosses to the device at its compressed size."""
    quant = entry.quant
    if quant is None:
        if dtype is None and device is None:
            return entry
        k = entry.k.to(device=device, dtype=dtype)
        v = entry.v.to(device=device, dtype=dtype)
        return FactKV(entry.key, list(entry.token_ids), k, v, entry.fingerprint, entry.origin)
    if device is not None:
        entry = map_tensors(entry, lambda t: t.to(device, non_blocking=True))
        quant = entry.quant
        assert quant is not None
    dtype = dtype or quant.dtype
    layers, tokens, heads, _ = entry.k.shape
    k = torch.empty(layers, tokens, heads, quant.k_dim, dtype=dtype, device=entry.k.device)
    v = torch.empty(layers, tokens, heads, quant.v_dim, dtype=dtype, device=entry.v.device)
    dequantize_into(entry, 0, tokens, k, v)
    return FactKV(entry.key, list(entry.token_ids), k, v, entry.fingerprint, entry.origin)


def dequantize_into(
    entry: FactKV, start: int, end: int, k_out: torch.Tensor, v_out: torch.Tensor
) -> None:
    """Tokens ``[start, end)`` of ``entry`` expanded into ``k_out`` and ``v_out``
    (``[layers, end - start, heads, dim]`` views of any dtype, e.g. a slice of the scratch the
    connector writes the cache from): the copy a plain entry would need; int4 into float32 on a
    CPU by :mod:`~inferscale_core.kvstore.int4_native`'s kernel where it is built (the same
    bits as the torch path below, at about the cost of a plain copy; computed in float32 when
    the output is)."""
    quant = entry.quant
    k, v = entry.k[:, start:end], entry.v[:, start:end]
    if quant is None:
        k_out.copy_(k)
        v_out.copy_(v)
        return
    work = torch.float32 if k_out.dtype == torch.float32 else k_out.dtype
    if quant.scheme == "fp8":
        k_out.copy_(k)
        k_out.mul_(quant.k_scale.to(work))
        v_out.copy_(v)
        v_out.mul_(quant.v_scale[:, start:end].to(work))
        return
    if k_out.device.type == "cpu" and int4_native.expand_into(entry, start, end, k_out, v_out):
        return
    assert quant.k_zero is not None and quant.v_zero is not None
    half = quant.k_dim // 2
    k_scale, k_zero = quant.k_scale.to(work), quant.k_zero.to(work)
    torch.addcmul(k_zero[..., :half], k & 15, k_scale[..., :half], out=k_out[..., :half])
    torch.addcmul(k_zero[..., half:], k >> 4, k_scale[..., half:], out=k_out[..., half:])
    if quant.k_fine is not None and quant.k_slot is not None:  # the wide channels' low bits
        _add_fine(quant.k_fine[:, start:end], quant.k_slot, k_scale, k_out)
    half = quant.v_dim // 2
    v_out[..., :half] = v & 15
    v_out[..., half:] = v >> 4
    layers, tokens, heads, dim = v_out.shape
    groups = quant.v_scale.shape[-1]
    grouped = v_out.view(layers, tokens, heads, groups, dim // groups)
    grouped.mul_(quant.v_scale[:, start:end, :, :, None].to(work))
    grouped.add_(quant.v_zero[:, start:end, :, :, None].to(work))


def map_tensors(entry: FactKV, fn: Callable[[torch.Tensor], torch.Tensor]) -> FactKV:
    """``entry`` with ``fn`` applied to each of its tensors (codes and scales alike)."""
    return with_tensors(entry, {name: fn(t) for name, t in entry_tensors(entry).items()})


def entry_tensors(entry: FactKV) -> dict[str, torch.Tensor]:
    """Every tensor of the entry by its name in the entry file."""
    out = {"k": entry.k, "v": entry.v}
    quant = entry.quant
    if quant is not None:
        out["k_scale"], out["v_scale"] = quant.k_scale, quant.v_scale
        if quant.k_zero is not None and quant.v_zero is not None:
            out["k_zero"], out["v_zero"] = quant.k_zero, quant.v_zero
        if quant.k_fine is not None and quant.k_slot is not None:
            out["k_fine"], out["k_slot"] = quant.k_fine, quant.k_slot
    return out


def stored_nbytes(scheme: str, layers: int, tokens: int, heads: int, k_dim: int, v_dim: int,
                  model_bytes: int) -> int:  # fmt: skip
    """Bytes of an entry of this shape stored as ``scheme`` (the model's dtype taking
    ``model_bytes`` an element): what ``nbytes`` of such an entry will be."""
    elements = layers * tokens * heads * (k_dim + v_dim)
    if scheme == "model":
        return elements * model_bytes
    if scheme == "fp8":
        return elements + 4 * layers * heads * (k_dim + tokens)
    groups = -(-v_dim // min(INT4_GROUP, v_dim))
    wide = wide_channels(k_dim)
    fine = layers * heads * (tokens * wide // 2 + k_dim) if wide else 0
    return elements // 2 + 2 * 2 * layers * heads * (k_dim + tokens * groups) + fine


# ---- helpers ----
def _absmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.abs().amax(dim=dim, keepdim=True).clamp_(min=_TINY)


def wide_channels(k_dim: int) -> int:
    """Key channels of a head kept in 8 bits under int4: the widest eighth (an even number,
    packed two a byte; none for a head under 16 channels)."""
    return (k_dim // 8) & ~1


def _int4_keys(
    k: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Keys ``[L, T, H, D]`` -> packed codes ``[L, T, H, D/2]`` uint8, scale and minimum
    ``[L, 1, H, D]`` float16 (per channel, over the tokens), and for the :func:`wide_channels`
    of each head (the widest ranges over the tokens) their low 4 bits of an 8-bit code
    ``[L, T, H, W/2]`` and every channel's slot among them ``[L, 1, H, D]`` (255: none).

    A wide channel's 4-bit code is the high half of its 8-bit code and its scale 16 of its
    steps, so ``code * scale + minimum`` reads it to within 16 steps and adding ``low *
    scale / 16`` makes it exact to the step. Measured on an H100 (SmolLM2 bf16, 200 LoCoMo
    questions): 8 of 64 key channels in 8 bits halved int4's KL (0.0036 / 0.0053 / 0.0064 ->
    0.0019 / 0.0028 / 0.0031 at k = 5 / 20 / 50) and raised top-1 agreement from 96.3-97.0% to
    97.3-97.4%; keys, not values, cost int4 its agreement there (bench/kv_quant_variants.py)."""
    codes, scale, low = int4_fit(k, dim=1)  # [L, T, H, D], [L, 1, H, D] x2
    layers, tokens, heads, dim = k.shape
    wide = wide_channels(dim)
    if not wide or not tokens:
        return _pack(codes), scale, low, None, None
    width = k.amax(dim=1, keepdim=True) - k.amin(dim=1, keepdim=True)  # [L, 1, H, D]
    chosen = width.topk(wide, dim=-1).indices.sort(dim=-1).values  # [L, 1, H, W]
    x = k.gather(-1, chosen.expand(layers, tokens, heads, wide))  # [L, T, H, W]
    w_low = x.amin(dim=1, keepdim=True).half()
    w_scale = ((x.amax(dim=1, keepdim=True) - w_low.float()) / 255).half().clamp_(min=_TINY_HALF)
    fine = ((x - w_low.float()) / w_scale.float()).round_().clamp_(0, 255).to(torch.uint8)
    every = chosen.expand(layers, tokens, heads, wide)
    codes.scatter_(-1, every, (fine >> 4).to(codes.dtype))
    scale.scatter_(-1, chosen, w_scale * 16)  # exact in float16: a power of two
    low.scatter_(-1, chosen, w_low)
    slot = torch.full((layers, 1, heads, dim), 255, dtype=torch.uint8, device=k.device)
    slot.scatter_(
        -1, chosen, torch.arange(wide, dtype=torch.uint8, device=k.device).expand_as(chosen)
    )
    return _pack(codes), scale, low, _pack(fine & 15), slot


def _add_fine(
    fine: torch.Tensor,  # uint8 [L, T, H, W/2]: the wide channels' low 4 bits, packed
    slot: torch.Tensor,  # uint8 [L, 1, H, D]: each channel's slot among them (255: none)
    k_scale: torch.Tensor,  # [L, 1, H, D] in the working dtype
    k_out: torch.Tensor,  # [L, T, H, D] the keys expanded from their 4-bit codes
) -> None:
    """Add each wide channel's low bits, ``low * scale / 16``, to ``k_out`` in place."""
    layers, tokens, heads, _ = k_out.shape
    low = torch.cat([fine & 15, fine >> 4], dim=-1).to(k_out.dtype)  # [L, T, H, W]
    wide = low.shape[-1]
    chosen = slot.to(torch.int64).argsort(dim=-1)[..., :wide]  # [L, 1, H, W] slot order
    steps = k_scale.gather(-1, chosen) / 16  # [L, 1, H, W]
    index = chosen.expand(layers, tokens, heads, wide)
    k_out.scatter_add_(-1, index, low * steps)


def _int4_groups(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Values ``[L, T, H, D]`` -> packed codes ``[L, T, H, D/2]`` uint8, scale and minimum
    ``[L, T, H, G]`` float16 (per token, G groups of :data:`INT4_GROUP` channels)."""
    layers, tokens, heads, dim = v.shape
    group = min(INT4_GROUP, dim)
    if dim % group:
        raise ValueError(f"a head of {dim} channels does not split into groups of {group}")
    grouped = v.reshape(layers, tokens, heads, dim // group, group)
    codes, scale, low = int4_fit(grouped, dim=-1)  # [L, T, H, G, group], [L, T, H, G, 1]
    return _pack(codes.reshape(v.shape)), scale.squeeze(-1), low.squeeze(-1)


def int4_fit(
    x: torch.Tensor, dim: int, clips: tuple[float, ...] = _CLIPS, refits: int = _REFITS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit codes of float32 ``x`` along ``dim`` (uint8 0..15, ``x``'s shape) with the float16
    scale and minimum of each slice (``dim`` kept, size 1) that leave the least squared error
    ``|code * scale + minimum - x|^2``: the min-max range and ranges narrowed around its middle
    by each of ``clips`` (an outlier clipped, the rest on finer steps), each then refitted
    ``refits`` times by least squares of ``x`` on its codes (the step and offset that best fit
    the codes chosen, then the codes again). Min-max alone is among the candidates, so no slice
    is worse than min-max's. Over 101 SmolLM2 entries (fp32) one refit lowers the squared error
    of keys and values by 6%; ranges clipped to 0.9 and 0.8 with two refits by 12%, but at 5x
    min-max's time (154 against 29 ms an 8B-shaped entry of 55 tokens on 2 cores, where a GPU's
    captured entries are compressed) and with no gain in top-1 agreement on the GPU (KL 7%
    lower): the default is one refit (57 ms).
    """
    lo = x.amin(dim=dim, keepdim=True)
    hi = x.amax(dim=dim, keepdim=True)
    mid, half = (hi + lo) / 2, (hi - lo) / 2
    best: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    best_err = torch.empty(0)
    for clip in (1.0, *clips):
        low = (mid - half * clip).half()
        scale = (half * clip / 7.5).half().clamp_(min=_TINY_HALF)
        for attempt in range(refits + 1):  # each range and each refit of it is a candidate
            codes = ((x - low.float()) / scale.float()).round_().clamp_(0, 15)
            err = (codes * scale.float() + low.float() - x).square_().sum(dim, keepdim=True)
            if best is None:
                best, best_err = (codes, scale, low), err
            else:
                better = err < best_err
                best = (
                    torch.where(better, codes, best[0]),
                    torch.where(better, scale, best[1]),
                    torch.where(better, low, best[2]),
                )
                best_err = torch.minimum(err, best_err)
            if attempt < refits:  # the least-squares step and offset for these codes
                c_mean, x_mean = codes.mean(dim, keepdim=True), x.mean(dim, keepdim=True)
                c_dev = codes - c_mean
                var = (c_dev * c_dev).sum(dim, keepdim=True)
                fitted = (c_dev * (x - x_mean)).sum(dim, keepdim=True) / var.clamp(min=_TINY)
                fitted = torch.where(var > 0, fitted, scale.float()).clamp_(min=_TINY)
                scale = fitted.half().clamp_(min=_TINY_HALF)
                low = (x_mean - scale.float() * c_mean).half()
    assert best is not None
    return best[0].to(torch.uint8), best[1], best[2]


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 ``[..., D]`` -> ``[..., D/2]``: the first half low, the second high."""
    half = codes.shape[-1] // 2
    if codes.shape[-1] % 2:
        raise ValueError(f"int4 packs an even number of channels, not {codes.shape[-1]}")
    return (codes[..., :half] | (codes[..., half:] << 4)).contiguous()


def with_tensors(entry: FactKV, tensors: dict[str, torch.Tensor]) -> FactKV:
    """``entry`` with its tensors replaced by those of :func:`entry_tensors`' names."""
    quant = entry.quant
    if quant is not None:
        quant = KVQuant(
            quant.scheme,
            quant.dtype,
            quant.k_dim,
            quant.v_dim,
            tensors["k_scale"],
            tensors["v_scale"],
            tensors.get("k_zero"),
            tensors.get("v_zero"),
            tensors.get("k_fine"),
            tensors.get("k_slot"),
        )
    return FactKV(
        entry.key,
        list(entry.token_ids),
        tensors["k"],
        tensors["v"],
        entry.fingerprint,
        entry.origin,
        quant,
    )
