"""Which part of one's life a question about the present asks of: its *facet*.

"What do I drive these days?" and "Traded the Fiat in for a second-hand Skoda Octavia estate"
share no word, and MiniLM puts the question nearer "My little Fiat 500 is great for parking"
than the trade (rank 20 of 47 user turns on the held-out life set). Both statements are close
to what *the car I drive* means, though. A facet is one such single-valued part of a life
(home, work, partner, car, ...) described by a few short phrases; its *prototype* is the mean of
their embeddings. A question whose embedding is near one facet's prototype (cosine at least
:data:`FACET_SCORE`, ahead of the next facet by :data:`FACET_MARGIN`) asks about that facet,
and the retriever also searches with the question's vector plus the prototype's
(:meth:`Facets.steer`): statements of the facet in other words come up with the ones that
share the question's words, and the newest of them goes first.

The phrases are generic (what a personal assistant is told about: the kinds of attribute
Mem0's and Zep's user profiles keep), written from the list of attributes, not from the
questions of any set they are measured on. Nothing is closed or hidden by a facet: it only
adds a list to the fusion of a question about the present and puts one of its facts first.
Measured in docs/BENCHMARKS.md ("What is true now").
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from inferscale_core.embedder import Embedder

FACETS: dict[str, tuple[str, ...]] = {
    "home": (
        "where I live",
        "I moved to a new flat in another city",
        "my home, my apartment, my house",
        "the neighbourhood I live in",
    ),
    "work": (
        "where I work",
        "my job and my employer",
        "I started a new job at a company",
        "my role and job title at work",
    ),
    "pay": ("how much I earn", "my salary and pay", "my income per year"),
    "rent": ("how much rent I pay", "my rent each month"),
    "partner": (
        "my partner",
        "my boyfriend or girlfriend, husband or wife",
        "I am dating someone new",
        "we broke up",
    ),
    "pet": ("my pet", "my dog or cat", "we adopted a new puppy or kitten"),
    "vehicle": ("the car I drive", "my car or motorbike", "I bought a new car"),
    "commute": ("how I get to work", "my commute by bus, train, bike or on foot"),
    "device": ("my phone", "my laptop or computer", "I got a new phone"),
    "sport": ("the sport I do", "my exercise and gym", "the team or club I train with"),
    "diet": ("what I can eat", "my diet and foods I avoid", "a food allergy or intolerance"),
    "learning": ("what I am learning", "a language or course I study", "classes I take"),
    "reading": ("the book I am reading", "the show or series I am watching"),
    "boss": ("my boss", "my manager or supervisor at work", "who I report to"),
    "music": ("the instrument I play", "my band or choir"),
    "health": ("my doctor or dentist", "my health and illness"),
}
"""Facet -> phrases that describe it; the prototype is the mean of their embeddings."""

FACET_SCORE = 0.45
"""The least cosine between a question and a facet's prototype for the question to ask about
it (the held-out life set's update questions: 0.42-0.75, the life set's 0.27-0.77)."""
FACET_MARGIN = 0.05
"""How far the best facet must lead the next one (a question between two asks neither)."""
FACET_FLOOR = 0.4
"""For a question with a facet, the newest of the steered search's candidates whose own nearest
facet is the question's, and whose cosine with the steered query is at least this share of the
best one's, goes first: a change said in other words ("Got the coeliac diagnosis, gluten is
out") is about half as near the question as the statement it replaces ("I eat pretty much
anything")."""
FACET_READ = 16
"""How many of the steered search's first candidates are read for the newest of the facet
(their vectors from the log): 100 at k=50 cost 6 ms a question at 10k facts, 16 under 1."""
FACET_MIX = 1.0
"""The prototype's weight in the steered query ``normalize(question + FACET_MIX * prototype)``."""


_PROTOTYPES: dict[str, torch.Tensor] = {}  # embedder name -> [facets, dim]
_LOCK = threading.Lock()


class Facets:
    """The prototypes of :data:`FACETS` under one embedder, made on first use.

    Thread-safe. The phrases (~45 short texts, ~0.1-0.3 s on the CPU) are embedded once per
    process and embedder ``name``: serve's per-user retrievers share them.
    """

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.names = tuple(FACETS)

    def prototypes(self) -> torch.Tensor:
        """``[len(FACETS), dim]`` float32, each row the normalised mean of a facet's phrases."""
        name = self.embedder.name
        with _LOCK:
            found = _PROTOTYPES.get(name)
            if found is None:
                rows = [self.embedder.embed(list(p)).mean(dim=0) for p in FACETS.values()]
                found = _PROTOTYPES[name] = F.normalize(torch.stack(rows), dim=1)
            return found

    def of(self, query: torch.Tensor) -> tuple[str, float] | None:
        """The facet ``query`` (``[1, dim]``, a unit vector) asks about and its cosine, or None
        when no facet is near enough or two are about as near."""
        scores = self.prototypes() @ query[0].to(torch.float32).cpu()  # [facets]
        best, second = scores.topk(2).values.tolist()
        if best < FACET_SCORE or best - second < FACET_MARGIN:
            return None
        return self.names[int(scores.argmax())], best

    def nearest(self, vectors: torch.Tensor) -> list[str]:
        """The nearest facet of each of ``vectors`` (``[n, dim]`` unit rows): what a stored
        fact is about, as far as the prototypes tell."""
        if len(vectors) == 0:
            return []
        scores = vectors.to(torch.float32).cpu() @ self.prototypes().T  # [n, facets]
        return [self.names[i] for i in scores.argmax(dim=1).tolist()]

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
