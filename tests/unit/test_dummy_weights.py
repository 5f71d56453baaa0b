"""The dummy configs of the GPU benches with 4-bit weights (bench/dummy.py, SUITE_WEIGHTS)."""

from __future__ import annotations

import json

import pytest

from bench.dummy import SHAPES, dummy_weights_config, resolve_dummy_config, write_dummy_config
from inferscale_core.fingerprint import model_fingerprint


def test_int4_writes_the_gguf_folders_w4a16_config(tmp_path) -> None:
    folder = write_dummy_config(tmp_path / "q", "llama-3.1-8b", weights="int4")
    config = json.loads((folder / "config.json").read_text())
    quant = config.pop("quantization_config")
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (quant["quant_method"], quant["format"]) == ("compressed-tensors", "pack-quantized")
    assert (weights["num_bits"], weights["symmetric"], weights["group_size"]) == (4, False, 32)
    assert quant["ignore"] == ["lm_head"] and config == SHAPES["llama-3.1-8b"]
    plain = write_dummy_config(tmp_path / "p", "llama-3.1-8b")
    assert "quantization_config" not in json.loads((plain / "config.json").read_text())
    assert model_fingerprint(folder) != model_fingerprint(plain)  # a store of its own


def test_a_config_file_gets_int4_in_a_copy_and_bad_values_are_refused(tmp_path) -> None:
    source = write_dummy_config(tmp_path / "src", "tiny-llama")
    folder = resolve_dummy_config(str(source), tmp_path / "work", "int4")
    assert folder != source and "quantization_config" not in (source / "config.json").read_text()
    assert "quantization_config" in json.loads((folder / "config.json").read_text())
    assert resolve_dummy_config(str(source), tmp_path / "work") == source  # bf16: as it is
    with pytest.raises(ValueError, match="weights must be one of bf16, int4"):
        dummy_weights_config({}, "int8")
    with pytest.raises(ValueError, match="quantized already"):
        dummy_weights_config({"quantization_config": {}}, "int4")
