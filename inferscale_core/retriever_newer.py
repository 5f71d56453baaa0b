"""Which later fact restates an earlier one: the newer of two statements of the same thing.

Most changes are never said as a pattern reads them ("First week at the new place done",
"Being a nurse is harder than I thought"), so the fact log cannot close the fact they replace
(:mod:`inferscale_core.slots`). Two statements about the same attribute of one's life embed
close to each other, closer than either does to the question that asks about it: "Ran the
city 10k in 52:10, a new best" and "I ran 48:30 at a 10k on Sunday" are near neighbours, while
"What's my fastest 10k?" is a paraphrase of both. So for a question about the present, the
retriever takes each of its first hits (an *anchor*), looks up the anchor's own neighbours in
the index, and puts the newest one that restates it (said later, similar to it by at least
:data:`NEWER_SIMILARITY`, and as relevant to the question as :data:`NEWER_RELEVANCE` times the
anchor) just above it: the later of two statements of the same thing is the likelier true now.
Nothing is closed or hidden: the anchor stays, one place lower, or, when the restatement
ends what the anchor says (:func:`ends_it`: "I quit the Sunday league", "Finished the book
last night"), after the hits that still hold, as a closed fact goes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

NEWER_ANCHORS = 2
"""How many of a present question's first hits look for a newer restatement."""
NEWER_NEIGHBOURS = 16
"""How many of an anchor's nearest facts (by cosine, from the index) are read."""
NEWER_SIMILARITY = 0.5
"""The least cosine between an anchor and a later fact for the later one to restate it."""
ENDING_SIMILARITY = 0.4
"""The least cosine for a later fact that ends something (:func:`ends_it`): "She took me off
the cetirizine and put me on fexofenadine" is 0.44 from "the cetirizine is doing nothing" (on
the eleven read life sets current first 9.49 -> 9.61 summed, none lower; 0.35 lost one)."""
NEWER_RELEVANCE = 0.7
"""The least cosine of the later fact with the question, as a share of the anchor's."""
ENDING_RELEVANCE = 0.3
"""The same share for a later fact that ends something: less than a restatement needs ("I quit
football" answers "What sport do I do?" less well than "I play football on Thursdays" did),
but some. Without it "Ruby gave me Fourth Wing ... I've ditched The Women halfway through" (an
ending, 0.4 from "Got an iPhone 15 ... Ruby is mortified" by the name they share) sent the new
phone to the end of "What phone have I got now?". The fifteen read life sets in one process
(the same embeddings for both): current first 229 -> 230 of 266, update R@5 +1, nothing lower;
the five blind sets the same to the question; 0.5 and 0.7 no better."""


def newest_restatement(
    anchor: int,
    neighbours: Sequence[tuple[int, float]],
    said: Mapping[int, str],
    asked: Mapping[int, float],
    endings: frozenset[int] = frozenset(),
    similarity: float = NEWER_SIMILARITY,
    relevance: float = NEWER_RELEVANCE,
    ending_similarity: float = ENDING_SIMILARITY,
    ending_relevance: float = ENDING_RELEVANCE,
) -> int | None:
    """The newest of ``neighbours`` (``[(fact id, cosine with the anchor)]``) said after the
    ``anchor`` that restates it; None if none does.

    Args:
        anchor: the fact id of the hit.
        neighbours: the anchor's nearest facts and their cosine with it.
        said: ``{fact id: the day it was said, YYYY-MM-DD}`` (the anchor's too).
        asked: ``{fact id: cosine with the question}`` (the anchor's too).
        endings: the neighbours that end something (:func:`ends_it`): they need not be as
            relevant to the question ("I quit football" answers "What sport do I do?" less
            well than "I play football on Thursdays" did, yet it says that is over:
            ``ending_relevance``), nor as similar to the anchor (``ending_similarity``).
        similarity: the least cosine with the anchor.
        relevance: the least cosine with the question, as a share of the anchor's.
    """
    day = said.get(anchor)
    if day is None:
        return None
    own = max(asked.get(anchor, 0.0), 0.0)
    later = [
        (said[fid], cosine, fid)
        for fid, cosine in neighbours
        if said.get(fid, "") > day
        and (
            (
                fid in endings
                and cosine >= min(similarity, ending_similarity)
                and asked.get(fid, -1.0) >= ending_relevance * own
            )
            or (cosine >= similarity and asked.get(fid, -1.0) >= relevance * own)
        )
    ]
    return max(later)[2] if later else None


_ENDING = re.compile(
    r"\b(?:quit|quitting|stopped|gave\s+up|given\s+up|sold|cancell?ed|finished|no\s+longer"
    r"|any\s*more|broke\s+up|split\s+up|died|passed\s+away|moved\s+out|retired\s+from"
    # a switch ends the old one too: "took me off the amlodipine", "swapped the gym for
    # running", "traded the Fiat in", "instead of", "ditched", "dropped", "called it a day",
    # "fallen by the wayside"
    r"|(?:took|taken|taking)\s+(?:me|him|her|us|them)\s+off"
    r"|switched|swapped|traded|replaced|instead\s+of"
    r"|ditched|dropped|packed\s+in|called\s+it\s+(?:a\s+day|quits)|by\s+the\s+wayside"
    r"|done\s+with|moved\s+on\s+from|left\s+(?:the|my)\s+(?:job|club|team|choir|band|gym))\b",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=8192)  # the same facts come back search after search
def ends_it(text: str) -> bool:
    """Whether a statement says something stopped ("I quit the choir", "We sold the van",
    "Finished the book", "I don't sing any more"): a restatement that ends its anchor."""
    return _ENDING.search(text) is not None
