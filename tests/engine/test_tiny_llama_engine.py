"""Injection on a tiny random Llama with llama3 RoPE scaling (a second engine: own process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
