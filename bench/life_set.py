"""The life set (``bench/data/life.json``): what is true now, what was then, what happened when.

Issue 36 asks for a memory that knows what is true *now*. LoCoMo cannot show it: its facts
rarely change. This set was written by hand for it: two years (2024-01 to 2025-12) of one
person's short chats with the assistant, ~230 user turns in 46 sessions, in which some 20
attributes change (residence Lisbon -> Porto -> Berlin, employer, role, salary, manager, dog,
partner, phone, car, gym, diet, favourite band, commute, German level, ...), ~60 turns name the
day of an event in the ways people do ("last weekend", "3 days ago", "on 12 March", "next
Friday", "in March 2024"), two people share a first name ("my cousin Alex", "Alex from work"),
and requests, thanks and small talk sit between the facts.

Layout (JSON)::

    {"name", "description", "asked_at": <default ISO datetime of the questions, aware>,
     "sessions": [{"id": "S12", "at": <ISO datetime, aware>,
                   "turns": [{"id": "S12:3", "speaker": "user" | "assistant", "text",
                              "date"?: <ISO day the event told of falls on>}]}],
     "questions": [{"id", "category", "question", "asked_at"?,
                    "current" + "superseded" (update) | "evidence" (the rest),
                    "interval"?: [start, end) ISO days}]}

Categories (:data:`CATEGORIES`): ``update`` asks a current value ("How much do I earn these
days?"); its ``current`` turns state the value true at ``asked_at``, its ``superseded`` turns
older values. ``past`` asks an earlier state, ``month`` what happened in a month (``interval``
required), ``paraphrase`` one fact in other words, ``people`` one that needs the right Alex,
``single`` one fact in its own words. ``asked_at`` is "today" for the question's time words
("last month"); the set's memory is told whole, whatever it is.

:func:`load` checks everything and raises ``ValueError`` naming the bad item: ids unique, a
turn's id ``<session>:<n>``, sessions in time order, times aware, dates ISO, evidence ids that
are user turns said before the question was asked, ``current`` and ``superseded`` apart,
intervals ordered, and every evidence turn of a month question dated (its label, else the day
it was said) inside the month. :meth:`LifeSet.to_conversations` gives the product's
conversations (one per session, each turn's id as its ``source_id``) for
:meth:`FactLog.add_conversation`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from inferscale_core.types import Conversation, Turn

DEFAULT = Path(__file__).parent / "data" / "life.json"
CATEGORIES = ("update", "past", "month", "paraphrase", "people", "single")
SPEAKERS = ("user", "assistant")
SOURCE = "chat"  # what the turns are: chats typed to the assistant (Conversation.source)

_TOP_KEYS = {"name", "description", "asked_at", "sessions", "questions"}
_SESSION_KEYS = {"id", "at", "turns"}
_TURN_KEYS = {"id", "speaker", "text", "date"}
_QUESTION_KEYS = {
    "id", "category", "question", "asked_at", "evidence", "current", "superseded", "interval",
}  # fmt: skip
_TURN_ID = re.compile(r"(S\d+):(\d+)")


@dataclass(frozen=True, slots=True)
class LifeTurn:
    """One turn of a session."""

    id: str  # "S12:3": session S12, position 3 (from 1)
    speaker: str  # "user" | "assistant"
    text: str
    at: datetime  # when it was said: its session's time (aware)
    date: date | None = None  # labelled: the day the event it tells of falls on

    @property
    def day(self) -> date:
        """The day it is about: its label, else the (local) day it was said."""
        return self.date or self.at.date()


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation with the assistant."""

    id: str  # "S12"
    at: datetime  # aware
    turns: tuple[LifeTurn, ...]


@dataclass(frozen=True, slots=True)
class Question:
    """One question and the turns that answer it."""

    id: str
    category: str  # one of CATEGORIES
    question: str
    asked_at: datetime  # aware: "today" for the question's time words
    evidence: tuple[str, ...]  # turn ids that answer it (an update question's ``current``)
    superseded: tuple[str, ...] = ()  # update questions: turns that state older values
    interval: tuple[date, date] | None = None  # [start, end), when the question names one


@dataclass(frozen=True, slots=True)
class LifeSet:
    """The set as loaded: sessions in time order, questions in file order."""

    name: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    path: Path | None = None
    turns: Mapping[str, LifeTurn] = field(default_factory=dict, repr=False)  # id -> turn

    def labelled(self) -> list[LifeTurn]:
        """The turns with a labelled ``date``, in order."""
        return [turn for turn in self.turns.values() if turn.date is not None]

    def to_conversations(self) -> Iterator[Conversation]:
        """One :class:`Conversation` per session: every turn at the session's time, its id as
        ``source_id`` (a fact's source turns lead back to it); ``source_id`` of the
        conversation ``<name>/<session id>``, so importing it twice adds nothing."""
        for session in self.sessions:
            yield Conversation(
                title=f"{self.name} — {session.id}",
                turns=[Turn(t.speaker, t.text, t.at, source_id=t.id) for t in session.turns],
                source=SOURCE,
                source_id=f"{self.name}/{session.id}",
            )


def load(path: Path | str = DEFAULT) -> LifeSet:
    """Read and check the set at ``path`` (ValueError naming the bad item if it is wrong)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return parse(data, path)


def parse(data: Any, path: Path | None = None) -> LifeSet:
    """Check the set's JSON (as :func:`json.loads` returns it); see the module docstring."""
    where = str(path) if path else "life set"
    top = _mapping(data, where, "the set", _TOP_KEYS)
    name = _text(top.get("name", "life"), where, "'name'")
    default_asked = top.get("asked_at")
    sessions: list[Session] = []
    turns: dict[str, LifeTurn] = {}
    for item in _list(top.get("sessions"), where, "'sessions'"):
        session = _session(item, f"{where}: session", turns)
        if sessions and session.at < sessions[-1].at:
            raise ValueError(
                f"{where}: session {session.id} ({session.at.isoformat()}) is earlier than"
                f" session {sessions[-1].id} before it: sessions must be in time order"
            )
        if any(s.id == session.id for s in sessions):
            raise ValueError(f"{where}: session id {session.id} is used twice")
        sessions.append(session)
    questions: list[Question] = []
    for item in _list(top.get("questions"), where, "'questions'"):
        question = _question(item, f"{where}: question", default_asked, turns)
        if any(q.id == question.id for q in questions):
            raise ValueError(f"{where}: question id {question.id} is used twice")
        questions.append(question)
    return LifeSet(name, tuple(sessions), tuple(questions), path, turns)


# ---- one item at a time ----------------------------------------------------------------------


def _session(item: Any, where: str, turns: dict[str, LifeTurn]) -> Session:
    raw = _mapping(item, where, "a session")
    sid = _text(raw.get("id"), where, "'id'")
    where = f"{where} {sid}"
    _keys(raw, where, _SESSION_KEYS)
    at = _aware(raw.get("at"), where, "'at'")
    mine: list[LifeTurn] = []
    for entry in _list(raw.get("turns"), where, "'turns'"):
        turn = _turn(entry, f"{where}: turn", sid, at)
        if turn.id in turns:
            raise ValueError(f"{where}: turn id {turn.id} is used twice")
        turns[turn.id] = turn
        mine.append(turn)
    return Session(sid, at, tuple(mine))


def _turn(item: Any, where: str, session_id: str, at: datetime) -> LifeTurn:
    raw = _mapping(item, where, "a turn")
    tid = _text(raw.get("id"), where, "'id'")
    where = f"{where} {tid}"
    _keys(raw, where, _TURN_KEYS)
    match = _TURN_ID.fullmatch(tid)
    if match is None or match.group(1) != session_id:
        raise ValueError(f"{where}: a turn id is '<session id>:<n>', here '{session_id}:<n>'")
    speaker = raw.get("speaker")
    if speaker not in SPEAKERS:
        raise ValueError(f"{where}: speaker must be one of {SPEAKERS}, got {speaker!r}")
    text = _text(raw.get("text"), where, "'text'")
    day = None
    if raw.get("date") is not None:
        if speaker != "user":
            raise ValueError(f"{where}: only a user turn tells of an event ('date')")
        day = _day(raw["date"], where, "'date'")
    return LifeTurn(tid, speaker, text, at, day)


def _question(item: Any, where: str, default_asked: Any, turns: Mapping[str, LifeTurn]) -> Question:
    raw = _mapping(item, where, "a question")
    qid = _text(raw.get("id"), where, "'id'")
    where = f"{where} {qid}"
    _keys(raw, where, _QUESTION_KEYS)
    category = raw.get("category")
    if category not in CATEGORIES:
        raise ValueError(f"{where}: category must be one of {CATEGORIES}, got {category!r}")
    text = _text(raw.get("question"), where, "'question'")
    asked = raw.get("asked_at", default_asked)
    if asked is None:
        raise ValueError(f"{where}: no 'asked_at', and the set gives no default one")
    asked_at = _aware(asked, where, "'asked_at'")
    if category == "update":
        if "evidence" in raw:
            raise ValueError(f"{where}: an update question has 'current' and 'superseded'")
        evidence = _ids(raw.get("current"), where, "'current'", turns, asked_at)
        superseded = _ids(raw.get("superseded"), where, "'superseded'", turns, asked_at)
        both = sorted(set(evidence) & set(superseded))
        if both:
            raise ValueError(f"{where}: {', '.join(both)} in both 'current' and 'superseded'")
    else:
        if "current" in raw or "superseded" in raw:
            raise ValueError(f"{where}: only an update question has 'current'/'superseded'")
        evidence = _ids(raw.get("evidence"), where, "'evidence'", turns, asked_at)
        superseded = ()
    interval = None
    if raw.get("interval") is not None:
        interval = _interval(raw["interval"], where)
    if category == "month":
        if interval is None:
            raise ValueError(f"{where}: a month question needs an 'interval'")
        start, end = interval
        for tid in evidence:
            day = turns[tid].day
            if not start <= day < end:
                raise ValueError(
                    f"{where}: evidence {tid} is about {day.isoformat()}, outside its interval"
                    f" [{start.isoformat()}, {end.isoformat()})"
                )
    return Question(qid, category, text, asked_at, evidence, superseded, interval)


def _ids(
    value: Any, where: str, what: str, turns: Mapping[str, LifeTurn], asked_at: datetime
) -> tuple[str, ...]:
    """Evidence ids: a non-empty list of user turns said before the question was asked."""
    ids = _list(value, where, what)
    for tid in ids:
        turn = turns.get(tid) if isinstance(tid, str) else None
        if turn is None:
            raise ValueError(f"{where}: {what} names {tid!r}, which is no turn of the set")
        if turn.speaker != "user":
            raise ValueError(f"{where}: {what} names {tid}, an {turn.speaker} turn")
        if turn.at > asked_at:
            raise ValueError(
                f"{where}: {what} names {tid}, said {turn.at.isoformat()}, after the question"
                f" was asked ({asked_at.isoformat()})"
            )
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: {what} names a turn twice")
    return tuple(ids)


def _interval(value: Any, where: str) -> tuple[date, date]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"{where}: 'interval' must be [start, end) as two ISO days")
    start, end = (_day(v, where, "'interval'") for v in value)
    if not start < end:
        raise ValueError(
            f"{where}: interval [{start.isoformat()}, {end.isoformat()}) is not ordered"
            " (start must come before end)"
        )
    return start, end


# ---- plain values ----------------------------------------------------------------------------


def _mapping(value: Any, where: str, what: str, keys: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {what} must be a JSON object, got {type(value).__name__}")
    if keys is not None:
        _keys(value, where, keys)
    return value


def _keys(value: dict[str, Any], where: str, keys: set[str]) -> None:
    unknown = sorted(set(value) - keys)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {sorted(keys)}"
        )


def _list(value: Any, where: str, what: str) -> Sequence[Any]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: {what} must be a non-empty list")
    return value


def _text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {what} must be a non-empty string, got {value!r}")
    return value


def _aware(value: Any, where: str, what: str) -> datetime:
    try:
        at = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {what} {value!r} is not an ISO datetime") from None
    if at.tzinfo is None:
        raise ValueError(f"{where}: {what} {value!r} has no UTC offset (e.g. +01:00)")
    return at


def _day(value: Any, where: str, what: str) -> date:
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {what} {value!r} is not an ISO day (YYYY-MM-DD)") from None
