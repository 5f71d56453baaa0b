"""What this CPU computes natively: the precisions the embedder and the vector index pick.

PyTorch reads the CPU's features once (cpuinfo); these only ask it, and answer False for what a
PyTorch build cannot tell.
"""

from __future__ import annotations

import torch


def native_bfloat16() -> bool:
    """bfloat16 dot products in hardware, summed in float32: AVX-512 BF16 or AMX."""
    return bool(
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )


def avx512_vnni() -> bool:
    """AVX-512 with VNNI: int8 dot products summed into int32 (no 16-bit saturation)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and bool(
        getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
    )


def fp8_kv_cache() -> bool:
    """What vLLM's CPU attention needs for an fp8 KV cache: AVX-512 or AMX (vLLM 0.32
    ``cpu_attn._get_attn_isa``)."""
    return _avx512() or bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def int4_weights() -> bool:
    """What vLLM's CPU 4-bit linear kernel (``cpu_gemm_wna16``, its CPUWNA16LinearKernel for
    compressed-tensors W4A16) needs: AVX-512. vLLM 0.32 builds it into its AVX-512 libraries
    only (``_C``, ``_C_AVX512``; ``_C_AVX2`` has none: checked in the wheel), so an AVX2 CPU
    cannot run a 4-bit folder."""
    return _avx512()


def _avx512() -> bool:
    return bool(getattr(torch.cpu, "_is_avx512_supported", lambda: False)())
