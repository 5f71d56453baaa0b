"""Who a text names, and as what: "my cousin Alex" and "Alex from work" are two people.

A question that names someone by a relation ("What does my cousin Alex do?", "Which club does
Alex from work support?") asks about that person, not about everyone of that first name. BM25
only sees the shared name, and the speaker-based people list of the retriever never fires in a
chat with the assistant (the speaker is "user"). :func:`mentions` reads the pairs a text gives:
``my <relation> <Name>`` ("my cousin Alex", "my sister Inês", "my old flatmate Ben"),
``<Name> from <place>`` ("Alex from work", "Tiago from the gym") and ``<Name>, my <relation>``;
a question may name the relation alone ("What does my sister do?": :func:`asked_about`).
The retriever (:meth:`Retriever._hybrid`) then treats a fact as the asked person's when its
text names them so, or when it names no one of that name and speaks of someone ("she",
"he") right after a turn that does (its search context); and as *another* person's when it
names the same first name with another relation. :func:`agrees` tells which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# a name: one capitalized word, not the start of a sentence by itself ("My" is no name)
_NAME = r"(?P<name>(?-i:[A-Z][\w'-]+))"
_RELATION = (
    r"(?P<rel>(?:(?:old|new|best|older|younger|little|big|ex)[\s-]+)?[a-z]+"
    r"(?:[\s-]in[\s-]law)?)"
)
# the people one names by relation alone ("my sister", "my boss"): a question may say no name
KIN_WORDS = (
    r"sister|brother|mum|mom|mother|dad|father|parents|cousin|aunt|uncle|niece|nephew|grandma"
    r"|grandmother|grandpa|grandfather|son|daughter|wife|husband|partner|girlfriend|boyfriend"
    r"|fianc[ée]e?|friend|boss|manager|colleague|neighbour|neighbor|flatmate|roommate|housemate"
    r"|landlord|landlady|therapist|doctor|teacher|coach"
)
"""The people one names by relation (an alternation, no group); time_query reads it too."""
_KIN = rf"(?P<kin>(?:older\s+|younger\s+|little\s+|big\s+|best\s+)?(?:{KIN_WORDS}))\b"
_PATTERNS = (
    re.compile(rf"\bmy\s+{_RELATION}\s+{_NAME}", re.IGNORECASE),
    re.compile(rf"\b{_NAME},?\s+my\s+{_RELATION}\b", re.IGNORECASE),
    re.compile(rf"\b{_NAME}\s+from\s+(?P<place>(?:the\s+)?[a-z]+)\b", re.IGNORECASE),
)
_KIN_ONLY = re.compile(rf"\bmy\s+{_KIN}(?!\s+(?-i:[A-Z]))", re.IGNORECASE)
_PRONOUN = re.compile(r"\b(?:she|he|her|him|his|they|them|their)\b|\b(?:she|he)'s\b", re.IGNORECASE)
_POSSESSIVE = re.compile(r"['’]s$")
_NOT_NAMES = frozenset({"i", "my", "the", "a", "an", "he", "she", "we", "they", "it"})


@dataclass(frozen=True, slots=True)
class Mention:
    """``name`` (case-folded) named as ``relation`` ("cousin", "from work"), case-folded."""

    name: str  # "" for a relation alone ("my sister")
    relation: str


def mentions(text: str) -> frozenset[Mention]:
    """The (name, relation) pairs of :data:`_PATTERNS` in ``text``."""
    found: set[Mention] = set()
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            name = _POSSESSIVE.sub("", match.group("name").casefold())  # "my brother Cian's"
            if name in _NOT_NAMES:
                continue
            groups = match.groupdict()
            if groups.get("place"):
                relation = "from " + " ".join(groups["place"].casefold().split()[-1:])
            else:
                relation = " ".join(groups["rel"].casefold().replace("-", " ").split())
            found.add(Mention(name, relation))
    return frozenset(found)


def asked_about(question: str) -> frozenset[Mention]:
    """The people a question names by relation: :func:`mentions`, and "my sister" without a
    name as ``Mention("", "sister")``."""
    named = mentions(question)
    alone = {
        Mention("", " ".join(m.group("kin").casefold().split()))
        for m in _KIN_ONLY.finditer(question)
    }
    return named | frozenset(alone)


def names_in(text: str) -> frozenset[str]:
    """Every capitalized word of ``text``, case-folded (a cheap superset of its names)."""
    words = re.findall(r"(?-i:\b[A-Z][\w'-]+)", text)
    return frozenset(_POSSESSIVE.sub("", w.casefold()) for w in words)


def agrees(asked: frozenset[Mention], text: str, context: str) -> bool | None:
    """Whether a fact (its ``text`` and search ``context``) is about the person the question
    names (``asked``, from :func:`mentions`): True when its text names them with that relation,
    or names no one of that name yet speaks of someone ("she", "he") after a context that
    does; False when it names that name with another relation only; None when it does not say.
    """
    said = mentions(text)
    names = {m.name for m in asked if m.name}
    if _matches(said, asked):
        return True
    if any(m.name in names and not _both_places(m, asked) for m in said):
        return False  # the same first name, another relation: someone else
    if not names & names_in(text) and _PRONOUN.search(text):
        around = mentions(context)
        if _matches(around, asked):
            return True
        if any(m.name in names for m in around):
            return False
    return None


def _both_places(said: Mention, asked: frozenset[Mention]) -> bool:
    """Whether ``said`` and the asked mention of its name both name a place ("Cian from work",
    "Cian from the Bishopstown clinic"): one place may be another's name, so they do not tell
    two people apart as "my brother Cian" and "Cian from work" do."""
    return said.relation.startswith("from ") and any(
        m.name == said.name and m.relation.startswith("from ") for m in asked
    )


def _matches(said: frozenset[Mention], asked: frozenset[Mention]) -> bool:
    """A pair of ``said`` is one of ``asked``, or has the relation of one that names none."""
    relations = {m.relation for m in asked if not m.name}
    return bool(said & asked) or any(m.relation in relations for m in said)
