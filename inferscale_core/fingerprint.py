"""Model fingerprint: which weights a stored KV entry belongs to.

KV computed by one model is meaningless for another, so every entry carries the fingerprint of
the model that encoded it, and the connector refuses entries whose fingerprint differs from the
engine's. It hashes the model's config and its weight files' names and sizes (cheap: no need to
read gigabytes of weights on every start).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_fingerprint(
    model_dir: Path | str, kv_cache_dtype: str = "auto", weights_on_load: str | None = None
) -> str:
    """A short stable hex id of a local Hugging Face model folder, and of the engine's KV
    cache dtype where it is not the model's (an fp8 cache's entries are fp8 values, scaled as
    that cache holds them: they belong to it, as a model's entries belong to the model), and of
    a quantization applied as vLLM loads the weights (``weights_on_load``: "fp8" for
    ``weights = fp8``; the fp8 model computes other KV than the bf16 one).

    The quantization a model is stored in is named by its folder already: a folder's
    ``quantization_config`` is part of ``config.json``, and a dequantized GGUF's folder holds
    other weight files than the original's."""
    root = Path(model_dir)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{root} has no config.json; is it a Hugging Face model folder?")
    config = json.loads(config_path.read_text())
    config.pop("transformers_version", None)  # re-saving with another version changes nothing
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for path in sorted(root.iterdir()):
        if path.suffix in _WEIGHT_SUFFIXES:
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
    if kv_cache_dtype != "auto":  # "auto" adds nothing: stores made before it keep their id
        digest.update(f"kv_cache_dtype:{kv_cache_dtype}".encode())
    if weights_on_load is not None:  # None adds nothing: stores made before it keep their id
        digest.update(f"weights_on_load:{weights_on_load}".encode())
    return digest.hexdigest()[:16]
