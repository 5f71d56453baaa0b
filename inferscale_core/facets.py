"""Which part of one's life a question about the present asks of: its *facet*.

"What do I drive these days?" and "Traded the Fiat in for a second-hand Skoda Octavia estate"
share no word, and MiniLM puts the question nearer "My little Fiat 500 is great for parking"
than the trade (rank 20 of 47 user turns on the held-out life set). Both statements are close
to what *the car I drive* means, though. A facet is one such single-valued part of a life
(home, employer, partner, car, dentist, ...), known by examples
(:mod:`inferscale_core.facet_examples`: ~14 chat messages that state it, mostly in passing, and
~24 questions that ask for it). A text's score for a facet is the mean cosine of its
:data:`FACET_NEIGHBOURS` nearest examples of that facet: a nearest-neighbour classifier, which
keeps a facet said in several ways ("got the keys to the house", "our street is so loud") where
one mean of its phrases blurred them (26 facets with their own examples against 16 described by
2-4 phrases each: current-first on seven life sets 5.74 -> 6.16 summed, docs/BENCHMARKS.md). A
question whose best score is at least :data:`FACET_SCORE`, ahead of the next facet's by
:data:`FACET_MARGIN`, asks about that facet, and the retriever also searches with the
question's vector plus the facet's *prototype*, the mean of its statements (:meth:`Facets.steer`):
statements of the facet in other words come up with the ones that share the question's words,
and the newest of them goes first. A stored fact is about its best facet among the statements,
and any other within :data:`FACET_SHARED` of it.

Nothing is closed or hidden by a facet: it only adds a list to the fusion of a question about
the present and puts one of its facts first. The examples' embeddings are computed once per
embedder (~2.2 s on two cores) and kept in the cache folder (``facets-<digest>.npy``), so a
later process reads them in milliseconds. Measured in docs/BENCHMARKS.md ("What is true now").
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from inferscale_core.embedder import Embedder
from inferscale_core.facet_examples import QUESTIONS, STATEMENTS
from inferscale_core.files import write_atomic
from inferscale_core.paths import cache_dir

logger = logging.getLogger(__name__)

FACETS: dict[str, tuple[str, ...]] = STATEMENTS
"""Facet -> chat messages that state it (:mod:`inferscale_core.facet_examples`)."""

FACET_NEIGHBOURS = 3
"""A text's score for a facet: the mean cosine of its this many nearest examples of it (2: 0.07
below on the seven life sets' current-first, summed; 1 and 5: 0.37 and 0.14 below 3)."""
FACET_SCORE = 0.5
"""The least score of a question for a facet for it to ask about it (0.45: 0.07 below on the
seven life sets' current-first, summed; 0.55: 0.38 below)."""
FACET_MARGIN = 0.03
"""How far the best facet must lead the next one (a question between two asks neither)."""
FACET_FLOOR = 0.4
"""For a question with a facet, the newest of the steered search's candidates that are about it
(:meth:`Facets.about`), and whose cosine with the steered query is at least this share of the
best one's, goes first: a change said in other words ("Got the coeliac diagnosis, gluten is
out") is about half as near the question as the statement it replaces ("I eat pretty much
anything")."""
FACET_READ = 16
"""How many of the steered search's first candidates are read for the newest of the facet
(their vectors from the log): 100 at k=50 cost 6 ms a question at 10k facts, 16 under 1."""
FACET_ABOVE = 8
"""How many of the first hits said after the facet's newest statement may stay above it (a
change told among other things, nearest another facet): on the nine read life sets current
first 7.82 -> 7.93 summed, no set lower."""
FACET_SHARED = 0.02
"""A stored fact is about every facet scoring within this of its best (:meth:`Facets.about`):
on the eleven read life sets current first 9.61 -> 9.83 summed, none lower (0.01: 9.72, 0.015:
9.78, 0.025: 9.79, 0.03: 9.73, 0.04: 9.73 with two sets lower, 0.07: 9.28)."""
FACET_MIX = 1.0
"""The prototype's weight in the steered query ``normalize(question + FACET_MIX * prototype)``."""


class _Examples:
    """The examples' unit embeddings under one embedder and what each is."""

    def __init__(self, vectors: torch.Tensor, facet: torch.Tensor, question: torch.Tensor):
        self.vectors = vectors  # [examples, dim] float32, unit rows
        facets = len(FACETS)
        self.prototypes = F.normalize(
            torch.stack([vectors[(facet == i) & ~question].mean(dim=0) for i in range(facets)]),
            dim=1,
        )  # [facets, dim]: the mean of each facet's statements
        # [facets, widest]: each facet's statements (then its questions), padded with -1
        self.statements = _padded([(facet == i) & ~question for i in range(facets)])
        self.both = _padded([facet == i for i in range(facets)])

    def scores(self, texts: torch.Tensor, questions: bool) -> torch.Tensor:
        """``[n, facets]``: each of ``texts`` (``[n, dim]`` unit rows)'s mean cosine with its
        :data:`FACET_NEIGHBOURS` nearest examples of each facet (statements only, or
        ``questions`` too)."""
        index = self.both if questions else self.statements  # [facets, widest]
        cosine = texts.to(torch.float32).cpu() @ self.vectors.T  # [n, examples]
        padded = torch.cat([cosine, torch.full((len(cosine), 1), -2.0)], dim=1)
        per_facet = padded[:, index]  # [n, facets, widest]; -1 reads the -2 column
        return per_facet.topk(FACET_NEIGHBOURS, dim=2).values.mean(dim=2)


def _padded(masks: list[torch.Tensor]) -> torch.Tensor:
    rows = [mask.nonzero().flatten() for mask in masks]
    widest = max(len(r) for r in rows)
    out = torch.full((len(rows), widest), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _example_texts() -> tuple[list[str], list[int], list[bool]]:
    """Every example, its facet's index and whether it is a question."""
    texts: list[str] = []
    facet: list[int] = []
    question: list[bool] = []
    for i, name in enumerate(FACETS):
        for asks, said in ((False, FACETS[name]), (True, QUESTIONS.get(name, ()))):
            texts += said
            facet += [i] * len(said)
            question += [asks] * len(said)
    return texts, facet, question


_EXAMPLES: dict[str, _Examples] = {}  # embedder name -> its examples
_LOCK = threading.Lock()


class Facets:
    """The facet classifier of :data:`FACETS` under one embedder, made on first use.

    Thread-safe. The examples (~1,000 short texts, ~2.2 s on two CPU cores) are embedded once per
    embedder ``name`` and kept in the cache folder; a process reads them once and serve's
    per-user retrievers share them.
    """

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.names = tuple(FACETS)

    def prototypes(self) -> torch.Tensor:
        """``[len(FACETS), dim]`` float32, each row the normalised mean of a facet's
        statements."""
        return self._examples().prototypes

    def of(self, query: torch.Tensor) -> tuple[str, float] | None:
        """The facet ``query`` (``[1, dim]``, a unit vector) asks about and its score, or None
        when no facet is near enough or two are about as near."""
        scores = self._examples().scores(query, questions=True)[0]  # [facets]
        best, second = scores.topk(2).values.tolist()
        if best < FACET_SCORE or best - second < FACET_MARGIN:
            return None
        return self.names[int(scores.argmax())], best

    def nearest(self, vectors: torch.Tensor) -> list[str]:
        """The nearest facet of each of ``vectors`` (``[n, dim]`` unit rows): what a stored
        fact is about, as far as the examples tell."""
        if len(vectors) == 0:
            return []
        scores = self._examples().scores(vectors, questions=False)  # [n, facets]
        return [self.names[i] for i in scores.argmax(dim=1).tolist()]

    def about(self, vectors: torch.Tensor) -> list[frozenset[str]]:
        """The facets each of ``vectors`` (``[n, dim]`` unit rows) is about: its nearest and
        any other scoring within :data:`FACET_SHARED` of it (a turn telling two things: "we
        signed a lease in Rosemont, 1,650 split two ways" is home and rent)."""
        if len(vectors) == 0:
            return []
        scores = self._examples().scores(vectors, questions=False)  # [n, facets]
        close = scores >= scores.amax(dim=1, keepdim=True) - FACET_SHARED  # [n, facets]
        return [frozenset(self.names[i] for i in row.nonzero().flatten().tolist()) for row in close]

    def steer(self, query: torch.Tensor, facet: str | None = None) -> torch.Tensor | None:
        """``query`` ``[1, dim]`` moved toward the prototype of ``facet`` (default: the one
        it asks about, :meth:`of`), normalised, on the query's device and dtype; None when it
        asks about none."""
        if facet is None:
            found = self.of(query)
            if found is None:
                return None
            facet = found[0]
        proto = self.prototypes()[self.names.index(facet)]
        moved = query[0].to(torch.float32).cpu() + FACET_MIX * proto
        return F.normalize(moved, dim=0).unsqueeze(0).to(query.device, query.dtype)

    def _examples(self) -> _Examples:
        name = self.embedder.name
        with _LOCK:
            found = _EXAMPLES.get(name)
            if found is None:
                texts, facet, question = _example_texts()
                vectors = _cached_embeddings(self.embedder, texts)
                found = _EXAMPLES[name] = _Examples(
                    vectors, torch.tensor(facet), torch.tensor(question)
                )
            return found


def _cached_embeddings(embedder: Embedder, texts: list[str]) -> torch.Tensor:
    """``[len(texts), dim]`` unit rows: read from the cache folder when an earlier process
    embedded the same texts with the same embedder, else embedded and written there. A
    damaged or unreadable cache file is embedded again (and replaced)."""
    digest = hashlib.sha256("\n".join([embedder.name, *texts]).encode()).hexdigest()[:24]
    path: Path | None = None
    try:
        path = cache_dir() / f"facets-{digest}.npy"
        array = np.load(path, allow_pickle=False)
        if array.shape == (len(texts), embedder.dim) and array.dtype == np.float32:
            return torch.from_numpy(array)
        logger.warning("facet examples cache %s has the wrong shape; embedding again", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        logger.warning("facet examples cache unreadable (%s); embedding again", exc)
    vectors = F.normalize(embedder.embed(texts).to(torch.float32).cpu(), dim=1)
    if path is not None:
        array = vectors.numpy()
        try:
            write_atomic(path, lambda tmp: np.save(tmp, array, allow_pickle=False), suffix=".npy")
        except OSError as exc:  # a read-only or full cache folder costs time, not the answer
            logger.warning("could not keep the facet examples in %s: %s", path, exc)
    return vectors
