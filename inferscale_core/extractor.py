"""Turns conversation turns into memory facts: add / update / delete operations.

Two extractors share one output type:

* :class:`DeterministicExtractor` — the statements of each turn become a dated fact, stripped
  of filler, requests and reactions, with its date ("yesterday", "3 days ago", "on 12 March",
  "last Saturday", "on the 12th", "in September 2024") resolved against the turn's timestamp
  (:mod:`inferscale_core.turn_dates`). The default for the embedded 135M model, and the fallback
  whenever structured output fails validation.
* :class:`LLMExtractor` — asks the engine for JSON-schema-constrained operations against the
  most similar existing facts (vLLM structured outputs), validates them, and falls back.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from inferscale_core.composer import render_chat
from inferscale_core.turn_dates import resolve_date
from inferscale_core.types import Fact, Turn

log = logging.getLogger(__name__)

NOT_FACT_SPEAKERS = frozenset({"assistant", "system", "tool"})
MIN_WORDS = 4
MAX_FACT_CHARS = 400

# Leading filler. Interjections go whatever follows them; a discourse word ("so", "well", "no")
# only when a comma, a stop or a new clause ("I", "we") follows it, so "So much for..." and
# "No one came" keep their first word.
_INTERJECTION = (
    r"(?:um+|uh+|erm|hmm+|oh+|ah+|ok(?:ay)?|yeah|yep|lol|omg|wow|(?:ha)+h?|hey|hi|hiya|hello|btw"
    r"|fyi|anyway)\b"
)
_DISCOURSE = (
    r"(?:(?:so|well|actually|like|yes|no|thanks|thank you|sorry|(?:quick\s+|small\s+)?update"
    r"|(?:good\s+)?(?:morning|evening"
    r"|afternoon|night))(?=\s*[,.!:;-])"
    r"|(?:so|well|actually)(?=\s+(?:I|we)\b))"
)
_FILLER_START = re.compile(rf"^(?:(?:{_INTERJECTION}|{_DISCOURSE})[\s,.!:;-]*)+", re.IGNORECASE)
_FILLER_END = re.compile(r"(?:[\s,]*(?:lol|haha+|hehe|:\)|:D|xD))+[\s.!]*$", re.IGNORECASE)
# a stop, or an emoji, which people end a sentence with ("snores like a train 😩 what can we
# do?")
_SENTENCE_END = re.compile(r"(?<=[.!?\u2600-\u27bf\U0001f300-\U0001faff])\s+")

# What a sentence of a person's turn does; a fact keeps only the sentences that tell.
#   asks:   a question ("...?", or one opening "why is", "can I"), or a request to the listener:
#           it opens with "can you", "do you", "tell me", "I'd like you to", "please", "(I)
#           need (dinner) ideas / tips" or an imperative of an assistant's trade ("write",
#           "explain", "summarize"); or it says "please" or "let's" and tells nothing concrete
#           ("Let's plan it for May, I'm in" tells).
#   reacts: it opens with a reaction to what was said ("that helps", "sounds good", "got it",
#           "thank you", "nice") and tells nothing concrete.
#   tells:  the rest.
# Concrete (_CONCRETE) is a first-person subject or possessive, a number, or a name (a capital
# inside the sentence): "Thanks, that's where Ana lives" tells; "That helps a bit" does not.
_ASKS = re.compile(
    r"^(?:please|pls|plz|kindly|(?:can|could|would|will)\s+(?:you|u)|do\s+(?:you|u)"
    r"|(?:can|could|may|should)\s+(?:i|we)"
    # a question in a statement's words but for the verb first: "is it going to rain all week"
    r"|(?:is|are|was|were|does|did|will|has|have)\s+(?:it|there|you|that|this)"
    r"|(?:what|where|when|who|why|how|which)(?:'s|\s+(?:is|are|was|were|do|does|did|can|should))"
    r"|(?:tell|give|show|help|remind)\s+(?:me|us)"
    r"|let\s+me\s+know|i(?:'d|\s+would)\s+like\s+you|i\s+(?:want|need)\s+you"
    r"|(?:i\s+)?need\s+(?:\w+\s+)?(?:ideas|suggestions|tips|recommendations)"
    r"|write|explain|summari[sz]e|translate|suggest|recommend|describe|draft|rewrite|brainstorm"
    # an imperative of an assistant's trade whose past differs from it ("Add milk to my list",
    # not "Added a shelf"; not "make" or "find", which people advise each other with), and the
    # chat's own turns ("forget I said anything")
    r"|add|generate|convert|calculate|list|ignore|try\s+again|forget\s+(?:it|that|i\s+said)"
    r"|never\s+mind|set\s+(?:me\s+)?(?:an?\s+)?(?:alarm|reminder|timer)"
    r")\b"
    # a question put to the listener without its question mark: "what curriculum would you
    # recommend" (not "when I was younger, we ...")
    r"|^(?:what|which|who|how)\b[^,.!?]*\b(?:would|do|can|could|should|will)\s+(?:you|u)\b",
    re.IGNORECASE,
)
_SOFT_ASKS = re.compile(r"\bplease\b|^let's\b", re.IGNORECASE)
_REACTS = re.compile(
    r"^(?:(?:that|this)(?:'s|\s+is|\s+was|\s+sounds|\s+helps|\s+helped|\s+makes|\s+looks|\s+works)"
    r"|sounds|got\s+it|makes\s+sense|thanks|thank\s+you"
    r"|no\s+worries|fair\s+enough|nice|cool|great|awesome|perfect|wow|interesting|amazing|lovely"
    r"|good|true|exactly|sure|cheers|nah|nope|brilliant|so\s+much\s+for)\b",
    re.IGNORECASE,
)
# reactions to the chat itself whatever they hold: "I didn't know that!", "I meant the other
# one", "not sure about that", "You're a lifesaver", "I forgot what I told you"
_REACTS_ANYWAY = re.compile(
    r"^(?:i\s+(?:didn't|did\s+not)\s+know\s+(?:that|this)|i\s+meant|not\s+sure\s+about\s+(?:that|this|it)"
    r"|you(?:'re|\s+are)\s+(?:a|an|the|so|too|right|amazing|brilliant|the\s+best)"
    r"|i\s+(?:forgot|forget)\s+what\s+i\s+(?:told|said))\b",
    re.IGNORECASE,
)
# the condition of a question ("if I moved to Spain, would I ...?"): part of the question
_CONDITION = re.compile(r"^(?:if|hypothetically|suppose|supposing|say)\b", re.IGNORECASE)
# "i have a date tmrw??", "we're getting a puppy?!": news said in disbelief, with the word
# order of a statement (I, we or my first, then no "should", "could", ...), tells
_EXCITED_NEWS = re.compile(
    r"^(?:i|i'm|i've|we|we're|we've|my|our)\b(?!\s+(?:should|could|would|can|might|shall)\b)"
    r".*(?:\?\?|\?!|!\?)$"
    # or a past verb first, the subject left out: "sat the exam last Wednesday and I reckon I
    # passed??"
    r"|^(?!(?:did|was|were|had)\b)[a-z]+ed\b.*\b(?:i|i'm|we|my|our)\b.*(?:\?\?|\?!|!\?)$"
    r"|^(?:sat|got|went|had|met|saw|won|lost|bought|sold|made|took|found|left|ran)\b(?!\s+(?:i|you|we)\b)"
    r".*\b(?:i|i'm|we|my|our)\b.*(?:\?\?|\?!|!\?)$",
    re.IGNORECASE,
)
# news told as a question: "did I tell you my mum's moving in?", "guess who got the job?? me!!",
# "can you believe I've been here ten years?", "did you know my aunt keeps the tent in the
# shed now" (not "did you know honey never spoils?": nothing of the teller's): it tells
_NEWS_ASKED = re.compile(
    r"^(?:did\s+i\s+(?:tell|mention)|guess\s+(?:what|who)|can\s+you\s+believe(?!\s+(?:it|that|this)\b)"
    r"|did\s+(?:you|u|ya)\s+know(?=.*\b(?:i|i'm|i've|we|we're|my|our)\b)"
    r"|you'?ll\s+never\s+(?:believe|guess))\b",
    re.IGNORECASE,
)
_CONCRETE = re.compile(r"(?i:\b(?:i|i'm|i've|i'd|i'll|my|mine|we|our|ours)\b)|\d|(?<=\s)[A-Z][a-z]")


# A request, question or reaction and a statement in one sentence, apart by a comma, a colon or
# a dash: "the interview is a week on Friday, can you give me some practice questions?", "Tell
# me a joke, my goldfish died this morning", "Help me plan a budget: I earn about $4,200".
_CLAUSE = re.compile(r"\s*(?:[,;:](?=\s)|[—–]|\s-\s)\s*")  # not "4,200" or "7:30"
_JOINER = re.compile(r"^(?:and|but|so|also)\s+", re.IGNORECASE)
_TAIL_ANY = re.compile(r"^(?:(?:got\s+)?any\s+(?:ideas|tips|suggestions))\b", re.IGNORECASE)


def split_tail_ask(sentence: str) -> list[str]:
    """``sentence`` cut into what it tells (its telling clauses, ending in a full stop) and the
    clauses that ask or react (:func:`sentence_kind` of each, after a leading "and", "but" or
    "so"), when it holds both; one piece when it does not, or when what it tells is under
    :data:`MIN_WORDS` words ("So, do you ...?", "Also, any tips ...?") or nothing concrete
    (:data:`_CONCRETE`: "Write a poem, something warm")."""
    clauses = [c for c in _CLAUSE.split(sentence.strip()) if c]
    if len(clauses) < 2:
        return [sentence]
    ends = sentence.rstrip()[-1:] if sentence.rstrip()[-1:] in "?!." else ""
    kinds = []
    for i, clause in enumerate(clauses):
        bare = _JOINER.sub("", clause)
        last = i == len(clauses) - 1
        if _TAIL_ANY.match(bare) or ends == "?" and _CONDITION.match(bare):
            kind = "asks"
        else:
            kind = sentence_kind(bare if last else bare.rstrip("?"))
        kinds.append(kind)
    tells = [c for c, k in zip(clauses, kinds, strict=True) if k == "tells"]
    if len(tells) == len(clauses) or not tells:
        return [sentence]
    told = ", ".join(tells).rstrip(" .!?")
    if len(told.split()) < MIN_WORDS or _CONCRETE.search(told) is None:
        return [sentence]  # "nah, the first version was better" tells nothing of its own
    # the rest as it was read: "..., so that was awesome" reacts as "that was awesome"
    rest = [_JOINER.sub("", c) for c, k in zip(clauses, kinds, strict=True) if k != "tells"]
    return [told + (ends if ends == "!" else "."), *rest]


def sentence_kind(sentence: str) -> str:
    """``"asks"``, ``"reacts"`` or ``"tells"``: what one sentence does (rules above)."""
    text = sentence.strip()
    concrete = _CONCRETE.search(text) is not None
    if _NEWS_ASKED.match(text):
        return "tells"
    if (
        text.endswith("?")
        and not _EXCITED_NEWS.match(text)
        or _ASKS.match(text)
        or (_SOFT_ASKS.search(text) and not concrete)
    ):
        return "asks"
    if _REACTS.match(text) and not concrete or _REACTS_ANYWAY.match(text):
        return "reacts"
    return "tells"


@dataclass(frozen=True, slots=True)
class FactOp:
    """One change to the memory: add a fact, update or delete an existing one."""

    op: str  # "add" | "update" | "delete"
    text: str
    refers_to: date | None = None
    target_id: int | None = None  # the existing fact an update/delete applies to


class Extractor(Protocol):
    name: str
    reads_similar: bool  # whether extract() reads ``similar`` (else the worker skips the search)

    def extract(self, turn: Turn, similar: Sequence[Fact] = ()) -> list[FactOp]: ...


def strip_filler(text: str) -> str:
    """Drop leading interjections and trailing laughter; collapse whitespace."""
    text = " ".join(text.split())
    text = _FILLER_START.sub("", text)
    text = _FILLER_END.sub("", text).strip(" ,;-")
    return text[:1].upper() + text[1:] if text else text


def _words_cut(text: str, limit: int) -> list[str]:
    """Cut a text longer than ``limit`` at the last space before it (mid-word only if none)."""
    pieces = []
    while len(text) > limit:
        cut = text.rfind(" ", 0, limit + 1)
        cut = cut if cut > 0 else limit
        pieces.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return [*pieces, text] if text else pieces


def _chunks(text: str, limit: int) -> list[str]:
    """Split a long text at sentence ends (and a too long sentence between words) into pieces of
    at most ``limit`` characters."""
    if len(text) <= limit:
        return [text]
    pieces, current = [], ""
    for long_sentence in _SENTENCE_END.split(text):
        for sentence in _words_cut(long_sentence, limit):
            if current and len(current) + 1 + len(sentence) > limit:
                pieces.append(current)
                current = sentence
            else:
                current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces


class DeterministicExtractor:
    """Each substantive turn of a person (not the assistant) becomes one or more dated facts."""

    name = "deterministic"
    reads_similar = False  # a turn's facts are its own sentences: nothing to compare with

    def extract(self, turn: Turn, similar: Sequence[Fact] = ()) -> list[FactOp]:
        if turn.speaker.lower() in NOT_FACT_SPEAKERS:
            return []
        # Questions and requests ask, reactions only react: keep the sentences that tell.
        sentences = (
            strip_filler(part)
            for s in _SENTENCE_END.split(" ".join(turn.text.split()))
            for part in split_tail_ask(s)
        )
        text = " ".join(s for s in sentences if s and sentence_kind(s) == "tells")
        if len(re.findall(r"[A-Za-z\u00C0-\uFFFF]+", text)) < MIN_WORDS:
            return []
        who = "" if turn.speaker.lower() == "user" else f"{turn.speaker}: "
        when = resolve_date(text, turn.timestamp)
        return [FactOp("add", who + chunk, when) for chunk in _chunks(text, MAX_FACT_CHARS)]


FACT_OPS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "operations": {
            "type": "array",
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "op": {"enum": ["add", "update", "delete"]},
                    "text": {"type": "string", "minLength": 3, "maxLength": MAX_FACT_CHARS},
                    "date": {"type": ["string", "null"]},
                    "target_id": {"type": ["integer", "null"]},
                },
                "required": ["op", "text"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["operations"],
    "additionalProperties": False,
}

_INSTRUCTIONS = (
    "Extract durable facts about the user from their message, as JSON operations. "
    "Use 'add' for new facts, 'update' (with target_id) when the message changes a known fact, "
    "'delete' (with target_id) when it says a known fact is no longer true. Dates are ISO "
    "(YYYY-MM-DD), resolved against the message date. Return no operations for small talk."
)


class InvalidOperations(ValueError):
    """Structured output that parsed but does not make sense against the known facts."""


def parse_operations(raw: str, similar: Sequence[Fact]) -> list[FactOp]:
    """Validate the engine's JSON against the schema and the known facts' ids."""
    import jsonschema

    data = json.loads(raw)
    jsonschema.validate(data, FACT_OPS_SCHEMA)
    known = {fact.id for fact in similar}
    ops = []
    targeted: set[int] = set()
    for item in data["operations"]:
        target = item.get("target_id") if item["op"] != "add" else None
        if item["op"] in ("update", "delete"):
            if target not in known:
                raise InvalidOperations(f"{item['op']} targets unknown fact {target}")
            if target in targeted:
                raise InvalidOperations(f"fact {target} is the target of two operations")
            targeted.add(target)
        when = date.fromisoformat(item["date"]) if item.get("date") else None
        ops.append(FactOp(item["op"], " ".join(item["text"].split()), when, target))
    return ops


class LLMExtractor:
    """Structured-output extraction with the engine; the deterministic one as fallback."""

    name = "llm"
    reads_similar = True  # the model may update or delete one of the similar facts

    def __init__(self, engine: Any, tokenizer: Any, fallback: Extractor | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.fallback = fallback or DeterministicExtractor()
        self.fallbacks = 0  # how often the structured output failed validation

    def _prompt_ids(self, turn: Turn, similar: Sequence[Fact]) -> list[int]:
        said = turn.timestamp.date().isoformat() if turn.timestamp else "unknown"
        known = "\n".join(f"[{f.id}] {f.text}" for f in similar) or "(none)"
        messages = [
            {"role": "system", "content": _INSTRUCTIONS},
            {
                "role": "user",
                "content": f"Known facts:\n{known}\n\nMessage ({said}, from {turn.speaker}):\n"
                f"{turn.text}",
            },
        ]
        rendered = render_chat(self.tokenizer, messages)
        return self.tokenizer.encode(rendered, add_special_tokens=False)

    def extract(self, turn: Turn, similar: Sequence[Fact] = ()) -> list[FactOp]:
        if turn.speaker.lower() in NOT_FACT_SPEAKERS:
            return []
        raw = ""
        try:
            raw = self.engine.generate_json(self._prompt_ids(turn, similar), FACT_OPS_SCHEMA)
            return parse_operations(raw, similar)
        except Exception as exc:  # noqa: BLE001 - any bad output means: fall back
            self.fallbacks += 1
            log.info("structured extraction failed (%s: %.120s); falling back", exc, raw)
            return self.fallback.extract(turn, similar)
