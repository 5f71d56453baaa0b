"""Turns conversation turns into memory facts: add / update / delete operations.

Two extractors share one output type:

* :class:`DeterministicExtractor` — the statements of each turn become a dated fact, stripped
  of filler, requests and reactions, with its date ("yesterday", "3 days ago", "on 12 March",
  "last Saturday", "in September 2024") resolved against the turn's timestamp (dateparser,
  English only, for named dates). The default for the embedded 135M model, and the fallback
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
from datetime import date, datetime, timedelta
from typing import Any, Protocol

from inferscale_core.composer import render_chat
from inferscale_core.types import Fact, Turn

log = logging.getLogger(__name__)

NOT_FACT_SPEAKERS = frozenset({"assistant", "system", "tool"})
MIN_WORDS = 4
MAX_FACT_CHARS = 400

# Leading filler. Interjections go whatever follows them; a discourse word ("so", "well", "no")
# only when a comma, a stop or a new clause ("I", "we") follows it, so "So much for..." and
# "No one came" keep their first word.
_INTERJECTION = r"(?:um+|uh+|erm|hmm+|oh|ah|ok(?:ay)?|yeah|yep|lol|haha+|hey|hi|hello|btw)\b"
_DISCOURSE = (
    r"(?:(?:so|well|anyway|actually|like|yes|no|thanks|thank you)(?=\s*[,.!:;-])"
    r"|(?:so|well|anyway|actually)(?=\s+(?:I|we)\b))"
)
_FILLER_START = re.compile(rf"^(?:(?:{_INTERJECTION}|{_DISCOURSE})[\s,.!:;-]*)+", re.IGNORECASE)
_FILLER_END = re.compile(r"(?:[\s,]*(?:lol|haha+|hehe|:\)|:D|xD))+[\s.!]*$", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

# What a sentence of a person's turn does; a fact keeps only the sentences that tell.
#   asks:   a question ("...?", or one opening "why is", "can I"), or a request to the listener:
#           it opens with "can you", "do you", "tell me", "I'd like you to", "please" or an
#           imperative of an assistant's trade ("write", "explain", "summarize"); or it says
#           "please" or "let's" and tells nothing concrete ("Let's plan it for May, I'm in" tells).
#   reacts: it opens with a reaction to what was said ("that helps", "sounds good", "got it",
#           "thank you", "nice") and tells nothing concrete.
#   tells:  the rest.
# Concrete (_CONCRETE) is a first-person subject or possessive, a number, or a name (a capital
# inside the sentence): "Thanks, that's where Ana lives" tells; "That helps a bit" does not.
_ASKS = re.compile(
    r"^(?:please|(?:can|could|would|will)\s+you|do\s+you|(?:can|could|may|should)\s+(?:i|we)"
    r"|(?:what|where|when|who|why|how|which)(?:'s|\s+(?:is|are|was|were|do|does|did|can|should))"
    r"|(?:tell|give|show|help|remind)\s+(?:me|us)"
    r"|let\s+me\s+know|i(?:'d|\s+would)\s+like\s+you|i\s+(?:want|need)\s+you"
    r"|write|explain|summari[sz]e|translate|suggest|recommend|describe|draft|rewrite|brainstorm"
    r")\b",
    re.IGNORECASE,
)
_SOFT_ASKS = re.compile(r"\bplease\b|^let's\b", re.IGNORECASE)
_REACTS = re.compile(
    r"^(?:(?:that|this)(?:'s|\s+is|\s+was|\s+sounds|\s+helps|\s+helped|\s+makes|\s+looks|\s+works)"
    r"|sounds|got\s+it|makes\s+sense|thanks|thank\s+you"
    r"|no\s+worries|fair\s+enough|nice|cool|great|awesome|perfect|wow|interesting|amazing|lovely"
    r"|good|true|exactly|sure)\b",
    re.IGNORECASE,
)
_CONCRETE = re.compile(r"(?i:\b(?:i|i'm|i've|i'd|i'll|my|mine|we|our|ours)\b)|\d|(?<=\s)[A-Z][a-z]")


def sentence_kind(sentence: str) -> str:
    """``"asks"``, ``"reacts"`` or ``"tells"``: what one sentence does (rules above)."""
    text = sentence.strip()
    concrete = _CONCRETE.search(text) is not None
    if text.endswith("?") or _ASKS.match(text) or (_SOFT_ASKS.search(text) and not concrete):
        return "asks"
    if _REACTS.match(text) and not concrete:
        return "reacts"
    return "tells"


_DAYS_AGO = re.compile(r"\b(\d{1,3}|a|one|two|three|four|five|six|seven)\s+days?\s+ago\b", re.I)
_WEEKS_AGO = re.compile(r"\b(\d{1,2}|a|one|two|three)\s+weeks?\s+ago\b", re.I)
_NUMBER_WORDS = {"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


@dataclass(frozen=True, slots=True)
class FactOp:
    """One change to the memory: add a fact, update or delete an existing one."""

    op: str  # "add" | "update" | "delete"
    text: str
    refers_to: date | None = None
    target_id: int | None = None  # the existing fact an update/delete applies to


class Extractor(Protocol):
    name: str

    def extract(self, turn: Turn, similar: Sequence[Fact] = ()) -> list[FactOp]: ...


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBER_WORDS[word.lower()]


# Named dates. A sentence naming a month, a weekday, an ISO date or a year ("in 2019") goes to
# dateparser (English only, against the turn's own time); the cheap check (_DATE_WORD) keeps
# every other turn away from it and is the guard on what it finds: a span it reads as a date
# ("We" as Wednesday, "900 a month", modal "may") counts only if it holds one of these words.
_MONTHS = (
    r"(?:january|february|march|april|june|july|august|september|october|november|december"
    r"|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\b|(?-i:May)\b"
)
_DATE_WORD = re.compile(
    rf"\b(?:{_MONTHS}"
    r"|(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|\d{4}-\d\d-\d\d\b"
    r"|(?:in|since|during|of)\s+(?:19|20)\d\d\b)",
    re.IGNORECASE,
)
# "from 3 to 5 May", "12-16 April", "between 2 and 6 September": the first day, the same month.
_DAY_RANGE = re.compile(
    r"\b(\d{1,2})(?:st|nd|rd|th)?\s*(?:-|–|to|till|until|and)\s*\d{1,2}(?:st|nd|rd|th)?"
    rf"(?=\s+(?:{_MONTHS}))",
    re.IGNORECASE,
)
_WEEKEND = re.compile(r"\b(last|this|next)\s+weekend\b", re.IGNORECASE)
_WEEKEND_SATURDAY = {"last": -2, "this": 5, "next": 12}  # days from this week's Monday
# A plan looks forward: "I'll fly on 28 October" is this October's, "I flew on 28 October" too.
_FUTURE = re.compile(
    r"\b(?:will|shall|going\s+to|gonna|plan(?:s|ning)?\s+to|postponed|rescheduled|next"
    r"|booked\s+for|scheduled\s+for|invited|is\s+booked|appointment|upcoming)\b|'ll\b",
    re.IGNORECASE,
)


_PAST_TENSE = re.compile(
    r"\b(?:was|were|went|did|had|got|came|left|flew|ran|saw|met|spent|bought|took|made"
    r"|began|won|lost|gave|found|sold|drove|wrote|\w{3,}ed)\b",
    re.IGNORECASE,
)
_WEEKDAY_ONLY = re.compile(
    rf"^(?!.*\b(?:{_MONTHS}))(?=.*\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b)", re.IGNORECASE
)
_YEARLESS_MONTH = re.compile(rf"^(?!.*\b(?:19|20)\d\d\b)(?=.*\b(?:{_MONTHS}))", re.IGNORECASE)


def _next_year(day: date) -> date | None:
    try:
        return day.replace(year=day.year + 1)
    except ValueError:  # 29 February
        return None


def _named_date(text: str, when: datetime) -> date | None:
    """The first named date of ``text`` (a weekend's Saturday, a month's first day)."""
    day = when.date()
    if match := _WEEKEND.search(text):
        monday = day - timedelta(days=day.weekday())
        return monday + timedelta(days=_WEEKEND_SATURDAY[match.group(1).lower()])
    if not _DATE_WORD.search(text):
        return None
    from dateparser.search import search_dates

    settings = {
        "RELATIVE_BASE": when.replace(tzinfo=None),
        "PREFER_DATES_FROM": "future" if _FUTURE.search(text) else "past",
        "PREFER_DAY_OF_MONTH": "first",
        "PREFER_MONTH_OF_YEAR": "first",
        "RETURN_AS_TIMEZONE_AWARE": False,
        "TIMEZONE": "UTC",
    }
    found = search_dates(_DAY_RANGE.sub(r"\1", text), languages=["en"], settings=settings)
    span, at = next(((s, a) for s, a in found or () if _DATE_WORD.search(s)), (None, None))
    if span is None or at is None:
        return None
    named = at.date()
    told_as_past = _PAST_TENSE.search(text) is not None
    if (
        settings["PREFER_DATES_FROM"] == "past"
        and not told_as_past
        and _YEARLESS_MONTH.search(span)
    ):
        # "the wedding is on 14 September", said in August: a date without its year, in a
        # sentence that tells no past, is the nearer of its two occurrences (dateparser's
        # "past" gives last year's); "I moved to Porto on 12 March" keeps the past one
        later = _next_year(named)
        if later is not None and later - day < day - named:
            return later
    if not told_as_past and _WEEKDAY_ONLY.search(span) and named < day:
        later = named + timedelta(weeks=1)  # "the lesson is on Wednesday", said on Monday
        if later - day < day - named:
            return later
    return named


def resolve_date(text: str, when: datetime | None) -> date | None:
    """The day ``text`` refers to, relative to when it was said (the turn's own day if none)."""
    if when is None:
        return None
    if named := _named_date(text, when):
        return named
    day = when.date()
    lowered = text.lower()
    if match := _DAYS_AGO.search(text):
        return day - timedelta(days=_count(match.group(1)))
    if match := _WEEKS_AGO.search(text):
        return day - timedelta(weeks=_count(match.group(1)))
    if "yesterday" in lowered or "last night" in lowered:
        return day - timedelta(days=1)
    if "tomorrow" in lowered:
        return day + timedelta(days=1)
    if "last week" in lowered:
        return day - timedelta(weeks=1)
    if "next week" in lowered:
        return day + timedelta(weeks=1)
    if "last month" in lowered:
        return (day.replace(day=1) - timedelta(days=1)).replace(day=1)
    if "last year" in lowered:
        return day.replace(year=day.year - 1, month=1, day=1)
    return day


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

    def extract(self, turn: Turn, similar: Sequence[Fact] = ()) -> list[FactOp]:
        if turn.speaker.lower() in NOT_FACT_SPEAKERS:
            return []
        # Questions and requests ask, reactions only react: keep the sentences that tell.
        sentences = (strip_filler(s) for s in _SENTENCE_END.split(" ".join(turn.text.split())))
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
