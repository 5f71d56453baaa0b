"""The GGUF -> compressed-tensors W4A16 repacking (inferscale_core/gguf_int4.py), on small
tensors quantized by gguf-py (Q4_0, Q4_1) or of random blocks (Q4_K)."""

from __future__ import annotations

import numpy as np
import pytest

from inferscale_core.gguf_int4 import (
    GROUP,
    dequantized,
    hf_name,
    int4_linears,
    int4_of,
    pack,
    quantization_config,
    round_zero,
)


def _quantized(type_name: str, rows: int = 8, cols: int = 256) -> np.ndarray:
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "Q4_K":  # any bytes are a valid block; keep the f16 d and dmin finite
        raw = np.random.default_rng(1).integers(0, 256, (rows, cols // 256 * 144), np.uint8)
        head = raw.reshape(-1, 144)
        head[:, 0:4] = np.array([0.01, 0.002], np.float16).view(np.uint8)
        return raw
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    x[:, :GROUP] += 0.7  # a block far from centred: its float offset is no integer zero
    return gguf.quants.quantize(x, qtype)


def _gguf_values(raw: np.ndarray, type_name: str, rows: int = 8, cols: int = 256) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(rows, cols)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q4_K"])
def test_the_codes_are_the_files_and_their_target_its_dequantization(type_name) -> None:
    raw = _quantized(type_name)
    w = int4_of(raw, type_name, 8, 256)
    assert w.codes.shape == (8, 256) and w.scales.shape == w.zeros.shape == (8, 256 // GROUP)
    assert w.codes.max() <= 15 and w.zeros.max() <= 15
    np.testing.assert_array_equal(w.target, _gguf_values(raw, type_name))


def test_q4_0_maps_exactly() -> None:
    raw = _quantized("Q4_0")
    w = int4_of(raw, "Q4_0", 8, 256)
    assert (w.zeros == 8).all()
    np.testing.assert_array_equal(dequantized(w, "float32"), _gguf_values(raw, "Q4_0"))


def test_a_float_zero_is_rounded_to_the_nearest_integer() -> None:
    scale = np.array([0.1, 0.1, 0.1, 0.0], np.float32)
    offset = np.array([-0.8, -0.74, 0.3, 0.5], np.float32)  # zeros 8, 7.4, -3, (scale 0)
    assert round_zero(scale, offset).tolist() == [8, 7, 0, 0]


def test_q4_1_error_is_at_most_half_a_step_where_the_zero_fits() -> None:
    raw = _quantized("Q4_1")
    w = int4_of(raw, "Q4_1", 8, 256)
    d = raw.reshape(-1, 20)[:, :2].copy().view(np.float16).astype(np.float32).reshape(8, -1)
    delta = np.abs(dequantized(w, "float32") - w.target)
    assert (delta <= 0.5 * np.repeat(d, GROUP, axis=1) + 1e-6).all()


def test_packing_is_compressed_tensors_order() -> None:
    w = int4_of(_quantized("Q4_1", rows=12), "Q4_1", 12, 256)  # 12 rows: zeros padded to 16
    t = pack(w)
    packed = t["weight_packed"].view(np.uint32)
    assert packed.shape == (12, 256 // 8) and t["weight_zero_point"].shape == (2, 256 // GROUP)
    shifts = np.arange(8, dtype=np.uint32) * 4
    codes = (packed[:, :, None] >> shifts) & 0xF  # (rows, cols/8, 8): low nibble first
    np.testing.assert_array_equal(codes.reshape(12, 256), w.codes)
    zp = t["weight_zero_point"].view(np.uint32)
    zeros = ((zp[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(16, -1)  # along rows
    np.testing.assert_array_equal(zeros[:12], w.zeros)
    assert (zeros[12:] == 0).all() and t["weight_shape"].tolist() == [12, 256]


def test_a_fused_layer_is_4_bit_only_where_all_its_parts_are() -> None:
    types = {
        "blk.0.attn_q.weight": "Q4_K",
        "blk.0.attn_k.weight": "Q4_K",
        "blk.0.attn_v.weight": "Q6_K",  # Q4_K_M: v of some layers is Q6_K
        "blk.0.attn_output.weight": "Q4_K",
        "blk.0.ffn_gate.weight": "Q4_1",
        "blk.0.ffn_up.weight": "Q4_1",
        "blk.0.ffn_down.weight": "Q8_0",
        "blk.0.attn_norm.weight": "F32",
        "token_embd.weight": "Q4_K",
    }
    assert int4_linears(types) == {
        "blk.0.attn_output.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_up.weight",
    }
    assert hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    assert hf_name("output.weight") == "lm_head.weight"


def test_the_config_is_asymmetric_w4a16_group_32() -> None:
    config = quantization_config(["model.layers.0.self_attn.v_proj"])
    weights = config["config_groups"]["group_0"]["weights"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    assert (weights["num_bits"], weights["symmetric"], weights["group_size"]) == (4, False, 32)
    assert weights["strategy"] == "group" and config["ignore"] == [
        "model.layers.0.self_attn.v_proj"
    ]
