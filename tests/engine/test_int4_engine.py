"""SmolLM2's GGUF as a 4-bit folder on the CPU engine (vLLM 0.32's CPUWNA16LinearKernel): its own
codes served, and injection as exact as on the float folder (a second engine: own process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale_core.cpu_features import int4_weights
from tests.support import SUPPORT
from tests.support.repo_process import run_python

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not int4_weights(),
        reason="vLLM's CPU 4-bit kernel (cpu_gemm_wna16) is built for AVX-512 only and this CPU"
        " lacks it: weights_plan dequantizes a Q4_0 GGUF here (tests/unit/test_weights_plan.py)",
    ),
]


def test_the_4_bit_folder_runs_and_injection_is_exact(tmp_path: Path):
    done = run_python([str(SUPPORT / "int4_check.py"), str(tmp_path)], timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["folder_bytes"] < 130e6  # the float32 folder: 542 MB
    assert report["max_abs_error"] < 0.35  # Q4_1's offsets rounded to an integer zero
    assert report["k1_same_tokens"] and report["k1_shift"] == 0
    assert report["k1_delta"] == 0.0  # the engine's own KV placed back: its own logits
    assert report["k1_injected"] == report["k1_span_end"]
    assert report["k5_refused"] is None
