"""vLLM's fp8 KV cache as an engine option: passed to vLLM as set, refused early where the
machine cannot run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferscale_core import cpu_features
from inferscale_core.vllm_plugin.vllm_engine import (
    EngineOptions,
    KVCacheDtypeError,
    check_kv_cache_dtype,
    engine_arguments,
)


def test_fp8_reaches_vllm_and_auto_leaves_its_default():
    options = EngineOptions(Path("/m"), Path("/s"), "f" * 16, kv_cache_dtype="fp8")
    assert engine_arguments(options, on_gpu=True)["kv_cache_dtype"] == "fp8"
    plain = EngineOptions(Path("/m"), Path("/s"), "f" * 16)
    assert "kv_cache_dtype" not in engine_arguments(plain, on_gpu=True)


def test_a_cpu_without_avx512_is_told_before_vllm_starts(monkeypatch):
    monkeypatch.setattr(cpu_features, "fp8_kv_cache", lambda: False)
    with pytest.raises(KVCacheDtypeError, match="AVX-512 or AMX.*kv_cache_dtype = auto"):
        check_kv_cache_dtype("fp8", on_gpu=False)
    check_kv_cache_dtype("fp8", on_gpu=True)  # a GPU runs it
    with pytest.raises(KVCacheDtypeError, match="auto or fp8"):
        check_kv_cache_dtype("int8", on_gpu=True)
