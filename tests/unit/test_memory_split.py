"""The memory a model's weights take and the GPU's split (memory_split.py), as ``doctor``
reports them (its weights check, on this machine's CPU engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.commands.doctor import check_weights
from inferscale_core.config import AppConfig
from inferscale_core.memory_split import memory_split, weights_bytes

GIB = 1 << 30


def test_smaller_weights_leave_the_room_to_the_kv_cache() -> None:
    total = 141 * GIB  # an H200
    bf16 = memory_split(total, 0.5, int(16.06e9), 4 * GIB)
    q4 = memory_split(total, 0.5, int(4.9e9), 4 * GIB)
    assert bf16.kv_cache + bf16.weights == q4.kv_cache + q4.weights == int(total * 0.5)
    assert q4.kv_cache - bf16.kv_cache == int(16.06e9) - int(4.9e9)
    assert bf16.pool == 4 * GIB and bf16.free == total - int(total * 0.5) - 4 * GIB
    text = q4.describe()
    assert text.startswith("GPU 141.0 GiB: weights 4.56 GiB, vLLM KV cache <= ")
    assert "memory pool 4.00 GiB, free" in text


def test_parts_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit in vLLM's share"):
        memory_split(8 * GIB, 0.5, int(16.06e9), 0)
    with pytest.raises(ValueError, match="memory pool .* does not fit"):
        memory_split(24 * GIB, 0.5, 4 * GIB, 13 * GIB)


def test_weights_bytes_count_the_files_and_fp8_on_load(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "model-1.safetensors").write_bytes(b"\0" * 3000)
    (tmp_path / "model-2.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "tokenizer.json").write_bytes(b"\0" * 500)  # not weights
    assert weights_bytes(tmp_path) == 4000
    assert weights_bytes(tmp_path, "fp8") == 2000


def test_doctor_says_the_weights_bytes_and_that_there_is_no_gpu(smollm2_path: Path) -> None:
    check = check_weights(AppConfig(), smollm2_path)
    assert check.status == "ok", check
    stored = sum(p.stat().st_size for p in smollm2_path.glob("*.safetensors"))
    assert stored > 500e6  # float32, dequantized
    assert check.detail == (
        "Q4_1, dequantized: the CPU engine (vLLM 0.32) has no GGUF loader;"
        f" the GGUF's tensors: 96.6 MB; the engine's weights: {stored / 1e6:,.1f} MB;"
        " no GPU: the CPU engine holds them in RAM"
    )


def test_doctor_refuses_fp8_weights_on_the_cpu_in_one_line() -> None:
    check = check_weights(AppConfig(weights="fp8"), None)
    assert check.status == "fail" and "weights = fp8 needs a GPU" in check.detail
    assert "\n" not in check.detail
