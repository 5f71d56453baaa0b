"""How a model's weights are served (inferscale_core/weights_plan.py): the plan per engine and
``weights`` setting, the GGUF checks, the refusals through the real CLI, the fingerprint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app import cli
from inferscale_core import model_registry
from inferscale_core.config import AppConfig, ConfigError
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.model_files import smollm2_gguf
from inferscale_core.weights_plan import (
    NO_CPU_INT4,
    NO_GGUF_LOADER,
    WeightsError,
    inspect_gguf,
    weights_plan,
)
from tests.support.cli_errors import one_error_line
from tests.support.tiny_gguf import write_gguf


def _folder(path: Path, quant: dict | None = None, dtype: str = "bfloat16") -> Path:
    path.mkdir(parents=True)
    config = {"model_type": "llama", "torch_dtype": dtype}
    if quant is not None:
        config["quantization_config"] = quant
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path


def _nothing_registered_or_built(home: Path) -> None:
    assert model_registry.load_registry() == {}
    models = home.parent / "cache" / "models"
    assert not models.exists() or not [p for p in models.iterdir() if p.is_dir()]


# --------------------------------------------------------------------------- GGUF headers


def test_the_embedded_gguf_is_q4_1_and_its_tensor_bytes_are_counted() -> None:
    info = inspect_gguf(smollm2_gguf())
    assert info.file_type == "Q4_1"
    assert info.tensor_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert info.weights_bytes == 96_576_768  # of a 98,362,432-byte file: the rest is metadata


@pytest.mark.parametrize(("tensor_type", "label"), [("Q4_K", "Q4_K"), ("Q8_0", "Q8_0")])
def test_without_a_file_type_the_quantized_tensors_name_it(tmp_path, tensor_type, label) -> None:
    info = inspect_gguf(write_gguf(tmp_path / "m.gguf", tensor_type))
    assert info.file_type == label and info.tensor_types == {"F32": 1, tensor_type: 1}


def test_a_file_type_in_the_metadata_names_it(tmp_path) -> None:
    import gguf

    path = write_gguf(tmp_path / "m.gguf", "Q4_K", int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    assert inspect_gguf(path).file_type == "Q4_K_M"


@pytest.mark.parametrize("keep", [60_000_000, 98_362_432 - 3000, 5000])
def test_a_gguf_cut_short_is_one_line(tmp_path, keep) -> None:
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf(), "rb") as src:
        cut.write_bytes(src.read(keep))
    with pytest.raises(WeightsError, match="cut short") as info:
        inspect_gguf(cut)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("tensor_type", ["Q8_1", "Q1_0"])
def test_a_tensor_type_the_dequantizer_cannot_read_is_named(tmp_path, tensor_type) -> None:
    with pytest.raises(WeightsError, match=f"holds tensors of type {tensor_type}, which"):
        inspect_gguf(write_gguf(tmp_path / "m.gguf", tensor_type))


# --------------------------------------------------------------------------- the plan


def test_a_gguf_is_dequantized_on_both_engines_and_says_why() -> None:
    for device in ("cpu", "cuda"):
        plan = weights_plan(smollm2_gguf(), device)
        assert (plan.quantization, plan.dequantize, plan.on_load) == ("Q4_1", True, None)
        assert plan.note == f"dequantized: {NO_GGUF_LOADER[device]}"
    assert "CPU engine (vLLM 0.32) has no GGUF loader" in weights_plan(smollm2_gguf(), "cpu").note


def test_a_q4_0_llama_gguf_is_served_4_bit_and_q4_1_dequantized(tmp_path) -> None:
    """Q4_0 maps exactly onto compressed-tensors W4A16 (gguf_int4.py), on both engines;
    Q4_1 and Q4_K keep the float folder (their offsets would be rounded)."""
    q4_0 = write_gguf(tmp_path / "q4_0.gguf", "Q4_0")
    assert inspect_gguf(q4_0).architecture == "llama" and inspect_gguf(q4_0).int4_exact
    for device in ("cpu", "cuda"):
        plan = weights_plan(q4_0, device, cpu_int4=True)
        assert (plan.int4, plan.dequantize, plan.on_load) == (True, False, None)
        assert plan.served == "4-bit (from Q4_0, compressed-tensors W4A16)"
        assert plan.note == f"{plan.served}: {NO_GGUF_LOADER[device]}"
    # an AVX2 CPU has no 4-bit kernel in vLLM's build for it: dequantized, and the note says so
    plan = weights_plan(q4_0, "cpu", cpu_int4=False)
    assert (plan.int4, plan.dequantize) == (False, True)
    assert plan.note == f"dequantized: {NO_GGUF_LOADER['cpu']}; {NO_CPU_INT4}"
    assert weights_plan(q4_0, "cuda", cpu_int4=False).int4  # the GPU has its own kernels
    assert weights_plan(q4_0, "cuda", "fp8").dequantize  # fp8 on load: the float folder
    for tensor_type in ("Q4_1", "Q4_K"):
        plan = weights_plan(write_gguf(tmp_path / f"{tensor_type}.gguf", tensor_type), "cuda")
        assert (plan.int4, plan.dequantize) == (False, True)


def test_models_list_says_a_4_bit_folder_comes_from_the_gguf(tmp_path) -> None:
    from inferscale_core.model_inventory import _quantization

    marker = {"source_size": 1, "quantization": "Q4_0", "int4": "compressed-tensors W4A16"}
    quantization, note = _quantization(tmp_path, marker, "cuda")
    assert (quantization, note.split(":")[0]) == (
        "Q4_0",
        "4-bit (from Q4_0, compressed-tensors W4A16)",
    )
    assert _quantization(tmp_path, {"source_size": 1, "quantization": "Q4_1"}, "cpu")[1] == (
        f"dequantized: {NO_GGUF_LOADER['cpu']}"
    )


def test_as_stored_refuses_a_gguf_and_fp8_needs_a_gpu() -> None:
    with pytest.raises(WeightsError, match="as-stored cannot serve .*Q4_1.*no GGUF loader"):
        weights_plan(smollm2_gguf(), "cpu", "as-stored")
    with pytest.raises(WeightsError, match="fp8 needs a GPU"):
        weights_plan(smollm2_gguf(), "cpu", "fp8")
    plan = weights_plan(smollm2_gguf(), "cuda", "fp8")  # dequantized, then fp8 as vLLM loads it
    assert (plan.dequantize, plan.on_load, plan.served) == (True, "fp8", "fp8 (quantized on load)")


def test_folders_as_stored_fp8_on_load_and_quantized(tmp_path) -> None:
    plain = _folder(tmp_path / "bf16")
    assert weights_plan(plain, "cpu") == weights_plan(plain, "cpu", "as-stored")
    assert weights_plan(plain, "cpu").quantization == "bfloat16"
    assert weights_plan(plain, "cuda", "fp8").on_load == "fp8"
    for method in ("awq", "gptq", "compressed-tensors", "fp8"):
        folder = _folder(tmp_path / method, {"quant_method": method, "bits": 4})
        plan = weights_plan(folder, "cuda")
        assert (plan.quantization, plan.dequantize, plan.on_load) == (method, False, None)
        with pytest.raises(WeightsError, match=f"it is {method} already"):
            weights_plan(folder, "cuda", "fp8")
    packed = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    w4a16 = _folder(tmp_path / "w4a16", packed)
    assert weights_plan(w4a16, "cpu", cpu_int4=True).quantization == "compressed-tensors"
    with pytest.raises(WeightsError, match="4-bit weights .* AVX-512 only"):
        weights_plan(w4a16, "cpu", cpu_int4=False)
    odd = _folder(tmp_path / "odd", {"quant_method": "hqq"})
    with pytest.raises(WeightsError, match="quantized with 'hqq'.*awq, compressed-tensors"):
        weights_plan(odd, "cuda")


def test_the_weights_setting_is_checked() -> None:
    assert AppConfig().weights == "auto"
    assert AppConfig(weights="fp8").weights == "fp8"
    with pytest.raises(ConfigError, match="weights must be one of auto, as-stored, fp8"):
        AppConfig(weights="int4")


# --------------------------------------------------------------------------- the CLI


def test_models_add_refuses_bad_weights_in_one_line_and_registers_nothing(
    home, tmp_path, capsys
) -> None:
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf(), "rb") as src:
        cut.write_bytes(src.read(60_000_000))
    cases = (
        (cut, "cut short"),
        (write_gguf(tmp_path / "q81.gguf", "Q8_1"), "holds tensors of type Q8_1"),
        (_folder(tmp_path / "odd", {"quant_method": "hqq"}), "quantized with 'hqq'"),
    )
    for source, words in cases:
        assert cli.main(["models", "add", str(source)]) == 2
        assert words in one_error_line(capsys)
        _nothing_registered_or_built(home)


def test_models_add_as_stored_refuses_a_gguf_before_dequantizing(home, tmp_path, capsys) -> None:
    (home).mkdir(parents=True, exist_ok=True)
    from inferscale_core import paths
    from inferscale_core.config import save

    save(AppConfig(weights="as-stored"), paths.config_file())
    gguf = tmp_path / "mine.gguf"
    shutil.copy2(smollm2_gguf(), gguf)
    assert cli.main(["models", "add", str(gguf)]) == 2
    assert "as-stored cannot serve mine.gguf (Q4_1)" in one_error_line(capsys)
    _nothing_registered_or_built(home)


# --------------------------------------------------------------------------- the fingerprint


def test_existing_fingerprints_stay_byte_identical(tmp_path) -> None:
    """The ids of stores made before the ``weights`` setting (values computed by the code
    before it, commit 2e410df), so their entries keep being found."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "transformers_version": "4.0"}')
    (folder / "model.safetensors").write_bytes(b"0" * 10)
    assert model_fingerprint(folder) == "27a14c1083d902f9"
    assert model_fingerprint(folder, "fp8") == "54e5a5fa66c4dab0"
    assert model_fingerprint(folder, weights_on_load=None) == "27a14c1083d902f9"


def test_the_quantization_is_part_of_the_fingerprint(tmp_path) -> None:
    """KV of the fp8-on-load model, of a quantized folder or of a dequantized GGUF is never
    injected into the bf16 model: each has a store of its own."""
    plain = _folder(tmp_path / "bf16")
    awq = _folder(tmp_path / "awq", {"quant_method": "awq", "bits": 4})
    ids = {
        model_fingerprint(plain),
        model_fingerprint(plain, weights_on_load="fp8"),
        model_fingerprint(plain, "fp8", weights_on_load="fp8"),
        model_fingerprint(awq),
    }
    assert len(ids) == 4
