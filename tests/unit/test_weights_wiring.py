"""The weights plan through the wiring: vLLM's ``quantization`` argument, the store's
fingerprint, and refusals before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.vllm_plugin.vllm_engine import EngineOptions, engine_arguments
from inferscale_core.weights_plan import WeightsError


def test_fp8_weights_reach_vllm_and_as_stored_leaves_its_default() -> None:
    options = EngineOptions(Path("/m"), Path("/s"), "f" * 16, quantization="fp8")
    assert engine_arguments(options, on_gpu=True)["quantization"] == "fp8"
    plain = EngineOptions(Path("/m"), Path("/s"), "f" * 16)
    assert "quantization" not in engine_arguments(plain, on_gpu=True)


def test_the_embedded_model_keeps_its_store(smollm2_path: Path, tmp_path: Path) -> None:
    """weights = auto: the dequantized SmolLM2 and the store it always had."""
    model_dir, store, on_load = wiring.model_and_store(AppConfig(), tmp_path)
    assert (model_dir, on_load) == (smollm2_path, None)
    assert store.fingerprint == model_fingerprint(smollm2_path)
    assert store.root == tmp_path / model_fingerprint(smollm2_path)
    options = wiring.engine_options(AppConfig(), store_root=tmp_path)
    assert options.quantization is None and options.fingerprint == store.fingerprint


@pytest.mark.parametrize(("weights", "words"), [("fp8", "needs a GPU"), ("as-stored", "GGUF")])
def test_weights_the_cpu_engine_cannot_serve_are_refused_first(
    smollm2_path: Path, tmp_path: Path, weights: str, words: str
) -> None:
    with pytest.raises(WeightsError, match=words):
        wiring.model_and_store(AppConfig(weights=weights), tmp_path)
    assert not list(tmp_path.iterdir())  # no store folder made
