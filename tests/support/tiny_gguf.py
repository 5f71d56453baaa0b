"""Small GGUF files written by the tests themselves: the header of a Llama, a few tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_gguf(path: Path, tensor_type: str = "F32", file_type: int | None = None) -> Path:
    """A GGUF of a Llama's metadata and two tensors, the second of ``tensor_type`` (a
    ``GGMLQuantizationType`` name; its bytes are zeros, laid out as that type's blocks)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    qtype = gguf.GGMLQuantizationType[tensor_type]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype.name in ("F32", "F16", "BF16"):
        raw = np.zeros((2, 32 * type_size), dtype=np.uint8)
    else:
        raw = np.zeros((2, type_size), dtype=np.uint8)  # (rows, bytes): one block a row
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
