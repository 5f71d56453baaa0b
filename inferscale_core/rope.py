"""Chunked RoPE: move stored keys to the absolute positions they take in a prompt.

A memory fact's keys are stored post-RoPE at the positions they were encoded at (their origin);
at request time ``shift`` rotates them by the difference to their place in that prompt,
``R(p') = R(p' - p) R(p)``. RoPE acts on each key alone (a per-pair rotation by
``position * inv_freq``), so a shifted key is the model's own key at ``p'`` exactly, provided the
frequencies do not depend on the sequence length. That holds for default, linear, llama3 and
yarn RoPE; dynamic NTK and longrope change their frequencies with the sequence length and are
refused.

YaRN also multiplies cos and sin by ``attention_scaling`` (its mscale), which makes it a scaled
rotation: ``shift`` moves keys by the pure rotation (:func:`pure_rotation`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedRopeError(ValueError):
    """The model's RoPE variant cannot move stored keys to new positions exactly."""


def _get(obj, name: str, default=None):
    value = getattr(obj, name, None)
    return default if value is None else value


def layer_type_params(config) -> dict[str, dict] | None:
    """``{layer type: RoPE parameters}`` of a config whose layer types each have their own RoPE
    (transformers 5.x Gemma 3: ``sliding_attention`` base 1e4, ``full_attention`` base 1e6),
    or None when one RoPE serves every layer."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        return params
    return None


def _rope_params(config, layer_type: str | None = None) -> dict:
    """The flat RoPE parameter dict of a transformers 5.x or 4.x config (``rope_type`` set), for
    the layers of ``layer_type`` when the config keys its RoPE by layer type."""
    params = getattr(config, "rope_parameters", None)
    per_type = layer_type_params(config)
    if per_type is not None:
        if layer_type not in per_type:
            raise UnsupportedRopeError(
                f"RoPE parameters are given per layer type ({sorted(per_type)}); no layer type"
                f" {layer_type!r} among them"
            )
        params = per_type[layer_type]
    if not isinstance(params, dict) or not params:  # 4.x style: rope_theta + rope_scaling
        params = dict(_get(config, "rope_scaling", {}))
    params = dict(params)
    params.setdefault("rope_theta", _get(config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """transformers' float32 ``1 / base ** (arange(0, dim, 2) / dim)``."""  # [dim // 2]
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama-3.1 frequency smoothing, op for op as transformers' ``_compute_llama3_parameters``."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_context_len = p["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn(base: float, dim: int, p: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    """YaRN inv_freq and mscale, op for op as transformers' ``_compute_yarn_parameters``."""
    orig = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / orig

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)  # [dim // 2]
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Everything needed to apply a model's RoPE to keys; hashable and model-independent."""

    head_dim: int  # per-head size of the key
    rotary_dim: int  # leading dims of each head that are rotated; the rest pass through
    inv_freq: tuple[float, ...]  # rotary_dim // 2 inverse frequencies (exact fp32 values), scaled
    attention_scaling: float  # multiplies cos and sin (yarn's mscale; 1.0 otherwise)
    is_neox_style: bool  # True: rotate-half (Llama, Qwen2, Mistral); False: gptj interleaved pairs
    rope_type: str

    @classmethod
    def from_hf_config(
        cls, config, is_neox_style: bool = True, layer_type: str | None = None
    ) -> RopeSpec:
        """Build from a transformers config (5.x ``rope_parameters`` or 4.x ``rope_scaling``);
        ``layer_type`` picks one entry of RoPE parameters given per layer type."""
        p = _rope_params(config, layer_type)
        rope_type = p["rope_type"]
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedRopeError(
                f"RoPE type {rope_type!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ROPE_TYPES)}): its frequencies depend on the sequence "
                "length (dynamic NTK, longrope/su) or it is not a plain 1-D rotation (mrope, ...), "
                "so stored keys cannot be moved to new positions exactly"
            )
        head_dim = _get(config, "head_dim") or config.hidden_size // config.num_attention_heads
        partial = p.get("partial_rotary_factor") or _get(config, "partial_rotary_factor")
        partial = partial or _get(config, "rotary_pct", 1.0)
        rotary_dim = int(head_dim * partial)
        base = float(p["rope_theta"])
        max_pos = _get(config, "max_position_embeddings")
        if rope_type in ("llama3", "yarn"):
            orig = _get(config, "original_max_position_embeddings")
            p.setdefault("original_max_position_embeddings", orig or max_pos)
        scaling = 1.0
        if rope_type == "yarn":
            inv_freq, scaling = _yarn(base, rotary_dim, p, max_pos)
        else:
            inv_freq = _default_inv_freq(base, rotary_dim)
            if rope_type == "linear":
                inv_freq = inv_freq / p["factor"]
            elif rope_type == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, p)
        return cls(
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            inv_freq=tuple(inv_freq.float().tolist()),
            attention_scaling=scaling,
            is_neox_style=is_neox_style,
            rope_type=rope_type,
        )


def pure_rotation(spec: RopeSpec) -> RopeSpec:
    """``spec`` without its cos/sin scale (yarn's mscale): the rotation that moves keys already
    rotated (and scaled) at one position to another, ``R(p') = R(p' - p) R(p)``."""
    if spec.attention_scaling == 1.0:
        return spec
    return dataclasses.replace(spec, attention_scaling=1.0)


def shift(
    k_post: torch.Tensor,  # [..., tokens, kv_heads, head_dim] post-RoPE at their origin
    by: int | torch.Tensor,  # positions to move them by (an int, or [tokens] int64)
    spec: RopeSpec,
    out: torch.Tensor | None = None,  # optional destination (e.g. a slice of a cache buffer)
) -> torch.Tensor:
    """Keys rotated at position p, moved to p + ``by``: one fp32 rotation, one rounding (to
    ``out``'s dtype, else the input's). A shift of 0 returns them unchanged (cos 1, sin 0)."""
    tokens = k_post.shape[-3]
    if isinstance(by, int):
        by = torch.full((tokens,), by, dtype=torch.int64)
    return rotate(k_post, by, pure_rotation(spec), out=out)


@functools.lru_cache(maxsize=16)
def _inv_freq(spec: RopeSpec, device: str) -> torch.Tensor:
    """The frequencies as a tensor on ``device``, made once (no host-to-device copy per call)."""
    return torch.tensor(spec.inv_freq, dtype=torch.float32, device=device)


def cos_sin(spec: RopeSpec, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``cos, sin`` of ``positions * inv_freq`` times ``attention_scaling``, as transformers.

    ``positions``: [tokens] int64. Returns two [tokens, rotary_dim // 2] fp32 tensors.
    """
    inv_freq = _inv_freq(spec, str(positions.device))  # [rotary_dim // 2]
    angles = positions.float()[:, None] * inv_freq  # [tokens, rotary_dim // 2]
    return angles.cos() * spec.attention_scaling, angles.sin() * spec.attention_scaling


def _apply(
    k: torch.Tensor,  # [..., tokens, kv_heads, head_dim]
    positions: torch.Tensor,  # [tokens]
    spec: RopeSpec,
    out_dtype: torch.dtype | None,
    out: torch.Tensor | None = None,  # [..., tokens, kv_heads, head_dim], written in place
) -> torch.Tensor:
    if k.dim() < 3 or k.shape[-1] != spec.head_dim or k.shape[-3] != positions.shape[0]:
        raise ValueError(
            f"k {tuple(k.shape)} must be [..., tokens={positions.shape[0]}, kv_heads, "
            f"head_dim={spec.head_dim}]"
        )
    cos, sin = cos_sin(spec, positions.to(k.device))  # [tokens, rotary_dim // 2]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [tokens, 1, rotary_dim // 2]
    x = k.float()  # [..., tokens, kv_heads, head_dim]
    dtype = out_dtype or (out.dtype if out is not None else k.dtype)
    # fp32 result buffer: the caller's when it is fp32 (no copy), else one rounding at the end.
    direct = out is not None and out.dtype == torch.float32
    result = out if direct else torch.empty(x.shape, dtype=torch.float32, device=x.device)
    rd = spec.rotary_dim
    if spec.is_neox_style:
        a, b = x[..., : rd // 2], x[..., rd // 2 : rd]
        ra, rb = result[..., : rd // 2], result[..., rd // 2 : rd]
    else:
        a, b = x[..., 0:rd:2], x[..., 1:rd:2]
        ra, rb = result[..., 0:rd:2], result[..., 1:rd:2]
    # ra = a*cos - b*sin ; rb = b*cos + a*sin, without full-size temporaries.
    torch.mul(a, cos, out=ra)
    ra.addcmul_(b, sin, value=-1.0)
    torch.mul(b, cos, out=rb)
    rb.addcmul_(a, sin)
    if rd != spec.head_dim:
        result[..., rd:] = x[..., rd:]
    if out is not None:
        if not direct:
            out.copy_(result)  # the single rounding to the cache dtype
        return out
    return result if dtype == torch.float32 else result.to(dtype)


def rotate(
    k_pre: torch.Tensor,  # [..., tokens, kv_heads, head_dim], e.g. [layers, tokens, ...]
    positions: torch.Tensor,  # [tokens] int64 absolute positions in the prompt
    spec: RopeSpec,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,  # optional destination, same shape (e.g. a slice of a buffer)
) -> torch.Tensor:
    """Apply RoPE to pre-RoPE keys: fp32 math, one rounding to ``out_dtype`` (default: input's)."""
    return _apply(k_pre, positions, spec, out_dtype, out=out)
