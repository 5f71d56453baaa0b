"""vLLM's fp8 KV cache (``kv_cache_dtype="fp8"``) as the connector reads and writes it.

vLLM allocates an fp8 cache as uint8 tensors, and its kernels store ``fp8(k / k_scale)`` and
``fp8(v / v_scale)``, one scale per layer (1.0 unless the checkpoint carries calibrated ones).
The connector keeps an entry in the cache's own terms: the fp8 values the engine wrote, typed as
their fp8 format. Placed back where they were computed they are the engine's own bytes (exact,
as a bf16 entry is in a bf16 cache). Moved, they are re-rotated as they are: RoPE is linear, so
rotating a scaled key is scaling the rotated one. Only the backend's own cache update takes real
values (it divides by the scales again): :func:`scales` gives what to multiply by first.
"""

from __future__ import annotations

from typing import Any

import torch

# vLLM's cache_config.cache_dtype -> the fp8 format its kernels store (CUDA and CPU).
FP8_FORMATS = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def fp8_format(cache_dtype: str) -> torch.dtype | None:
    """The fp8 format of a cache of vLLM's ``cache_dtype``; None for a cache in the model's
    dtype ("auto", "bfloat16", ...)."""
    return FP8_FORMATS.get(cache_dtype)


def typed(cache: torch.Tensor, fp8: torch.dtype | None) -> torch.Tensor:
    """``cache`` seen as its elements: an fp8 cache's uint8 bytes as ``fp8``, others as they
    are (a view, same shape and strides)."""
    return cache.view(fp8) if fp8 is not None and cache.dtype == torch.uint8 else cache


def scales(layer: Any) -> tuple[float, float]:
    """The layer's ``(k_scale, v_scale)``: what a stored fp8 value is multiplied by to be the
    real value the backend's cache update divides again."""
    return float(getattr(layer, "_k_scale_float", 1.0)), float(
        getattr(layer, "_v_scale_float", 1.0)
    )


def exact_integers(dtype: torch.dtype) -> int:
    """How many consecutive integers from 1 ``dtype`` holds exactly (the layout probe writes
    numbered elements in digits of this base)."""
    if dtype == torch.float32:
        return 1 << 24
    if dtype == torch.float8_e4m3fn:
        return 16  # 3 mantissa bits: 1..16
    if dtype == torch.float8_e5m2:
        return 8  # 2 mantissa bits: 1..8
    return 256  # bf16 (8 significant bits), fp16
