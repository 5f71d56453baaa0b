"""An embedder that counts what it is asked to embed: the real one underneath, unchanged."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inferscale_core.embedder import Embedder


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def name(self) -> str:
        return self.inner.name

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        self.texts.extend(texts)
        return self.inner.embed(texts)
