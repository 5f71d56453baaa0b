"""What the installed vLLM can load: its weight quantizations and whether it has a GGUF loader.

inferscale_core/weights_plan.py writes these facts down for the two engines (vLLM 0.32 on the
CPU, 0.26 on CUDA: no GGUF loader in either) so that planning needs no vLLM import; the tests
and the GPU bench check them against the vLLM that is installed.
"""

from __future__ import annotations

import importlib.util


def engine_quantizations() -> frozenset[str]:
    """vLLM's ``quantization=`` methods (``QUANTIZATION_METHODS``)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return frozenset(QUANTIZATION_METHODS)


def has_gguf_loader() -> bool:
    """Whether this vLLM loads GGUF files (a ``"gguf"`` quantization and its loader)."""
    loader = importlib.util.find_spec("vllm.model_executor.model_loader.gguf_loader")
    return loader is not None or "gguf" in engine_quantizations()
