"""A GGUF's own 4-bit codes repacked into a compressed-tensors W4A16 folder vLLM serves.

vLLM has no GGUF loader (see :mod:`inferscale_core.weights_plan`), but it serves
compressed-tensors ``pack-quantized`` folders: int4 weights, a scale per group of 32 inputs and
an integer zero point (``symmetric: false``: value = scale * (code - zero), codes and zeros
0..15). vLLM 0.26 runs it on CUDA with Marlin/Machete (``CompressedTensorsWNA16``,
``WNA16_ZP_SUPPORTED_TYPES_MAP = {4: uint4}``) and vLLM 0.32 on the CPU with
``CPUWNA16LinearKernel`` (uint4 with zero points, any even group size).

The 4-bit codes are the file's, unchanged; what changes is the block's affine map:

* **Q4_0** (value = d * (q - 8)): scale d, zero 8, exact but for the f16 scale held in bf16
  (2^-9 relative; SmolLM2's weights as Q4_0: mean KL 0.7013 vs 0.7017 with f32 scales).
* **Q4_1** (value = d * q + m) and **Q4_K** (per sub-block of 32: value = d*sc * q - dmin*m):
  the offset is a float, the format's zero point an integer, so each group of 32 keeps its
  scale and gets the nearest integer zero (:func:`round_zero`). That moves every weight of a
  block by the same up to half a step, and it is too much: on SmolLM2 (Q4_1) the logits'
  mean KL to the GGUF's own is 0.79 and top-1 agrees on 19 of 31 tokens, so
  :mod:`inferscale_core.weights_plan` uses the 4-bit folder only for exact files (Q4_0).

Linear weights of other types (Q5/Q6/Q8, F16) are written unquantized, in the folder's dtype,
and named in the config's ``ignore``; so are the embeddings, norms and an untied ``lm_head``.
vLLM fuses q/k/v and gate/up, whose parts must agree, so a fused layer is 4-bit only where all
its parts are. The folder holds no float copy of the 4-bit weights.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferscale_core.model_basics import ModelSetupError

GROUP = 32  # inputs per scale and zero point: a Q4_0/Q4_1 block, a Q4_K sub-block
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
#: GGUF block name -> Hugging Face module of a Llama layer (``model.layers.N.``).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))
_SHARD_BYTES = 2 << 30


def quantization_config(ignore: list[str]) -> dict:
    """The ``quantization_config`` of the folder: compressed-tensors W4A16, asymmetric, g32."""
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": False,
        "strategy": "group",
        "group_size": GROUP,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "block_structure": None,
        "observer_kwargs": {},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
    }


# --------------------------------------------------------------------------- codes


@dataclass(frozen=True, slots=True)
class Int4:
    """One tensor's 4-bit form: value[r, c] = scale[r, c // 32] * (codes[r, c] - zeros[r, c // 32]).

    ``target`` is the GGUF's own dequantization (float32), kept to measure the fit."""

    codes: np.ndarray  # uint8 (rows, cols), 0..15
    scales: np.ndarray  # float32 (rows, cols // 32)
    zeros: np.ndarray  # uint8 (rows, cols // 32), 0..15
    target: np.ndarray  # float32 (rows, cols)


def int4_of(raw: np.ndarray, type_name: str, rows: int, cols: int) -> Int4:
    """The codes of a ``type_name`` tensor's raw bytes ``raw`` (rows x cols values)."""
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if type_name == "Q4_0":
        blocks = blocks.reshape(-1, 18)  # d f16, 16 bytes of codes
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n, 1)
        q = _nibbles(blocks[:, 2:])  # (n, 32)
        scale, offset = d, -8 * d
    elif type_name == "Q4_1":
        blocks = blocks.reshape(-1, 20)  # d f16, m f16, 16 bytes of codes
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        q = _nibbles(blocks[:, 4:])
        scale, offset = d, m
    elif type_name == "Q4_K":
        import gguf

        blocks = blocks.reshape(-1, 144)  # d, dmin f16; 12 bytes of 6-bit scales; 128 of codes
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, mn = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])  # (n, 8) each
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q = (qs & 0x0F).reshape(-1, 32)  # sub-blocks in order: (n * 8, 32)
        scale = (d * sc.astype(np.float32)).reshape(-1, 1)
        offset = -(dmin * mn.astype(np.float32)).reshape(-1, 1)
    else:
        raise ValueError(f"{type_name} is not a 4-bit GGUF type ({', '.join(INT4_TYPES)})")
    target = scale * q.astype(np.float32) + offset  # the GGUF's dequantization, (n, 32)
    s, z = scale[:, 0], round_zero(scale[:, 0], offset[:, 0])  # Q4_0: z = 8, exact
    groups = cols // GROUP
    return Int4(
        q.reshape(rows, cols),
        s.reshape(rows, groups),
        z.reshape(rows, groups),
        target.reshape(rows, cols),
    )


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """A Q4_0/Q4_1 block's 32 codes from its 16 bytes: low nibbles first, then high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def round_zero(scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The integer zero z in 0..15 nearest to the block's float one (-offset / scale): value =
    scale * (code - z) then differs from scale * code + offset by at most scale / 2 where z
    is not clipped (a least-squares fit of scale and z was no better: KL 0.85 vs 0.79)."""
    safe = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(-offset / safe), 0, 15).astype(np.uint8)


def dequantized(w: Int4, scale_dtype: str = "bfloat16") -> np.ndarray:
    """What the engine computes with: scales rounded to ``scale_dtype`` times (codes - zeros)."""
    import torch

    s = torch.from_numpy(w.scales).to(getattr(torch, scale_dtype)).float().numpy()
    u = w.codes.astype(np.float32) - np.repeat(w.zeros, GROUP, axis=1).astype(np.float32)
    return np.repeat(s, GROUP, axis=1) * u


def weight_error(w: Int4, scale_dtype: str = "bfloat16") -> dict:
    """max and rms |Δ| of :func:`dequantized` vs the GGUF's dequantization, and max |weight|."""
    delta = np.abs(dequantized(w, scale_dtype) - w.target)
    return {
        "max_abs": float(delta.max()),
        "rms": float(np.sqrt((delta**2).mean())),
        "max_weight": float(np.abs(w.target).max()),
    }


def pack(w: Int4) -> dict[str, np.ndarray]:
    """compressed-tensors ``pack-quantized`` tensors: codes 8 per int32 along the inputs,
    zeros 8 per int32 along the outputs (low nibble first), scales (rows, groups)."""
    rows, cols = w.codes.shape
    shifts = (np.arange(8, dtype=np.uint32) * 4)[None, None, :]
    packed = (w.codes.reshape(rows, cols // 8, 8).astype(np.uint32) << shifts).sum(2)
    zeros = w.zeros
    if rows % 8:
        zeros = np.concatenate([zeros, np.zeros((8 - rows % 8, zeros.shape[1]), np.uint8)])
    zt = zeros.T.reshape(zeros.shape[1], -1, 8).astype(np.uint32)  # (groups, rows/8, 8)
    zp = (zt << shifts).sum(2).T  # (rows/8, groups)
    return {
        "weight_packed": packed.astype(np.uint32).view(np.int32),
        "weight_scale": w.scales,
        "weight_zero_point": np.ascontiguousarray(zp.astype(np.uint32)).view(np.int32),
        "weight_shape": np.array([rows, cols], dtype=np.int64),
    }


# --------------------------------------------------------------------------- the folder


def int4_linears(types: dict[str, str]) -> set[str]:
    """The GGUF linear weights (``blk.N.attn_q.weight`` ...) written 4-bit, of ``types`` (name ->
    GGUF type): those of a 4-bit type whose fused siblings (q/k/v, gate/up) are 4-bit too."""
    chosen = set()
    for name, type_name in types.items():
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
            continue
        if parts[2].endswith("norm") or parts[3] != "weight" or type_name not in INT4_TYPES:
            continue
        siblings = next((f for f in _FUSED if parts[2] in f), (parts[2],))
        names = [f"blk.{parts[1]}.{s}.weight" for s in siblings]
        if all(types.get(n) in INT4_TYPES for n in names):
            chosen.add(name)
    return chosen


def hf_name(gguf_name: str) -> str:
    """The Hugging Face (Llama) name of a GGUF tensor; KeyError for one it does not know."""
    stem, _, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}"
    return f"{_TOP_NAMES[stem]}.{kind}"


def _row_order(gguf_name: str, rows: int, heads: int, kv_heads: int) -> np.ndarray | None:
    """Undo llama.cpp's rotary permutation of attn_q/attn_k rows (as transformers does)."""
    kind = gguf_name.split(".")[-2] if gguf_name.startswith("blk.") else ""
    if kind not in ("attn_q", "attn_k"):
        return None
    n = heads if kind == "attn_q" else kv_heads
    return np.arange(rows).reshape(n, rows // n // 2, 2).swapaxes(2, 1).reshape(rows)


def write_int4_folder(gguf_path: Path, out: Path, *, name: str, progress: bool = False) -> dict:
    """Write ``gguf_path`` (a Llama GGUF) into the empty folder ``out`` as a compressed-tensors
    W4A16 folder (the module docstring); return facts for the ``COMPLETE`` marker, with the
    largest weight error of the 4-bit tensors (:func:`weight_error`, bf16 scales)."""
    import gguf
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from inferscale_core.gguf_header import read_header
    from inferscale_core.model_basics import drop_load_kwargs, enforce_offline
    from inferscale_core.weights_plan import inspect_gguf

    enforce_offline()
    started = time.perf_counter()
    header = read_header(gguf_path)
    arch = header.metadata.get("general.architecture")
    if arch != "llama":
        raise ModelSetupError(f"{gguf_path.name} is a {arch!r} GGUF; 4-bit folders are Llama only")
    source = dict(pretrained_model_name_or_path=str(gguf_path.parent), gguf_file=gguf_path.name)
    config = AutoConfig.from_pretrained(**source, local_files_only=True)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    names = {t.value: t.name for t in gguf.GGMLQuantizationType}
    types = {t.name: names[t.type_id] for t in header.tensors}
    chosen = int4_linears(types)
    data = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size, ignore, errors = 0, set(), []
    for tensor in header.tensors:
        key = hf_name(tensor.name)
        if key == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue
        qtype = gguf.GGMLQuantizationType[types[tensor.name]]
        cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = data[tensor.offset : tensor.offset + rows * cols // block * type_size]
        order = _row_order(tensor.name, rows, heads, kv_heads)
        if tensor.name in chosen:
            w = int4_of(raw, types[tensor.name], rows, cols)
            if order is not None:
                w = Int4(*(a[order] for a in (w.codes, w.scales, w.zeros, w.target)))
            errors.append(weight_error(w) | {"tensor": key, "type": types[tensor.name]})
            module = key.removesuffix(".weight")
            new = {f"{module}.{k}": torch.from_numpy(v) for k, v in pack(w).items()}
            new[f"{module}.weight_scale"] = new[f"{module}.weight_scale"].to(torch.bfloat16)
        else:
            values = gguf.quants.dequantize(np.asarray(raw), qtype).reshape(
                tuple(reversed(tensor.shape))
            )
            if order is not None:
                values = values.reshape(rows, cols)[order].reshape(values.shape)
            linear = key.startswith(("model.layers.", "lm_head")) and not key.endswith(
                "norm.weight"
            )
            if linear and key.endswith(".weight"):
                ignore.add(key.removesuffix(".weight"))
            new = {key: torch.from_numpy(np.array(values, np.float32)).to(torch.bfloat16)}
        for k, v in new.items():
            if size > _SHARD_BYTES:
                shards.append({})
                size = 0
            shards[-1][k] = v.contiguous()
            size += v.numel() * v.element_size()
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if "lm_head.weight" not in weight_map and not getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = True  # a GGUF without `output` ties it (llama.cpp does)
    # lm_head is never 4-bit (vLLM and transformers keep a tied one as the embeddings)
    config.quantization_config = quantization_config(sorted(ignore | {"lm_head"}))
    config.dtype = "bfloat16"
    config.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    generation._from_model_config = False
    generation.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(**source, local_files_only=True)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out, save_jinja_files=False)
    drop_load_kwargs(out / "tokenizer_config.json")
    worst = max(errors, key=lambda e: e["max_abs"] / max(e["max_weight"], 1e-30), default={})
    stat = gguf_path.stat()
    return {
        "name": name,
        "source": str(gguf_path),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "model_type": config.model_type,
        "dtype": "bfloat16",
        "int4": f"compressed-tensors W4A16 asymmetric g{GROUP}",
        "int4_tensors": len(errors),
        "unquantized_linears": len(ignore - {"lm_head"}),
        "max_abs_error": max((e["max_abs"] for e in errors), default=0.0),
        "worst_relative_error": worst,
        "build_seconds": round(time.perf_counter() - started, 2),
        "quantization": inspect_gguf(gguf_path).file_type,
    }
