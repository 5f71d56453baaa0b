"""Where the GPU's memory goes for one model: weights, vLLM's KV cache, the memory pool, free.

Pure arithmetic, for ``doctor``: vLLM takes ``gpu_memory_utilization`` of the GPU for its
weights, activations and KV cache; the KV store's device tier (the memory pool,
``gpu_pool_gib``) lives beside it; what is left is free. The weights' bytes are counted from
the files that are loaded (:func:`weights_bytes`), so smaller (quantized) weights leave that
much more room to vLLM's KV cache. Activations and CUDA graphs come out of vLLM's share too;
they are not known before the engine starts, so the KV cache figure is an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class MemorySplit:
    total: int  # bytes of the GPU
    weights: int
    kv_cache: int  # at most this much: activations and graphs come out of it too
    pool: int  # the KV store's device tier
    free: int

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"GPU {self.total / gib:.1f} GiB: weights {self.weights / gib:.2f} GiB, vLLM KV"
            f" cache <= {self.kv_cache / gib:.2f} GiB, memory pool {self.pool / gib:.2f} GiB,"
            f" free {self.free / gib:.2f} GiB"
        )


def memory_split(total: int, utilization: float, weights: int, pool: int) -> MemorySplit:
    """The split of a GPU of ``total`` bytes; ``ValueError`` when the parts do not fit (the
    weights beyond vLLM's share, or the pool beyond what vLLM leaves)."""
    engine = int(total * utilization)
    if weights >= engine:
        raise ValueError(
            f"the weights ({weights / 2**30:.2f} GiB) do not fit in vLLM's share"
            f" ({utilization:.0%} of {total / 2**30:.1f} GiB)"
        )
    if pool > total - engine:
        raise ValueError(
            f"the memory pool ({pool / 2**30:.2f} GiB) does not fit beside vLLM's share"
            f" ({(total - engine) / 2**30:.2f} GiB left)"
        )
    return MemorySplit(total, weights, engine - weights, pool, total - engine - pool)


def weights_bytes(folder: Path, on_load: str | None = None) -> int:
    """Bytes of the weight files in ``folder`` as the engine holds them: the files' sizes, or
    with weights quantized to fp8 on load (``on_load``), one byte an element of the saved
    dtype's (config.json's ``torch_dtype``/``dtype``)."""
    import json

    stored = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if on_load != "fp8":
        return stored
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    dtype = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return stored // _ELEMENT_BYTES.get(str(dtype), 2)
