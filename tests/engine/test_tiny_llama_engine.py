"""Injection on a tiny random Llama with llama3 RoPE scaling (a second engine: own process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inferscale_core.cpu_features import fp8_kv_cache
from tests.support import SUPPORT
from tests.support.repo_process import run_python

pytestmark = pytest.mark.engine

SCRIPT = SUPPORT / "tiny_llama_check.py"


def test_tiny_llama3_rope_injection_is_exact(smollm2_path: Path, tmp_path: Path):
    done = run_python([str(SCRIPT), str(tmp_path), str(smollm2_path)], timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["k1_same_tokens"]
    assert report["k1_shift"] == 0  # placed where the engine computed it: its own bytes
    assert report["k1_delta"] <= 1e-4
    assert report["k1_prerope_delta"] <= 1e-4  # fp32: the other stored form is exact too
    assert report["k5_shifts"][0] == 0 and all(s > 0 for s in report["k5_shifts"][1:])  # moved on
    assert report["k1_injected"] == report["k1_span_end"]
    assert report["k5_refused"] is None
    assert report["k5_injected"] == report["k5_span_end"] - report["k5_prefix_cached"]
    assert report["k5_delta_vs_hf"] <= 1e-4


@pytest.mark.skipif(
    not fp8_kv_cache(), reason="vLLM's CPU attention has an fp8 KV cache on AVX-512 or AMX only"
)
def test_tiny_llama3_fp8_cache_injection_is_exact(smollm2_path: Path, tmp_path: Path):
    """vLLM's fp8 KV cache: a fact placed back where it was computed is the engine's own fp8
    bytes, so its logprobs equal vLLM's own fp8 prefill of the same prompt exactly."""
    env = dict(os.environ, TINY_KV_CACHE_DTYPE="fp8")
    done = run_python([str(SCRIPT), str(tmp_path), str(smollm2_path)], timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["kv_cache_dtype"] == "fp8"
    assert report["entry_dtype"] == "torch.float8_e4m3fn"  # kept as the cache holds them
    assert report["k1_shift"] == 0
    assert report["k1_same_tokens"]
    assert report["k1_delta"] == 0.0  # the engine's own bytes: exact, as bf16 is in bf16
    assert report["two_full_prefills_delta"] == 0.0
    assert report["k1_injected"] == report["k1_span_end"]
    assert report["k5_refused"] is None
    assert report["k5_injected"] == report["k5_span_end"] - report["k5_prefix_cached"]
    # moved facts are re-rotated and rounded to fp8 again; the oracle's own question tokens
    # stay in fp32 (seen: 0.061)
    assert report["k5_delta_vs_hf"] <= 0.15
