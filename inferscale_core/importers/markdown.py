"""Markdown / plain-text transcripts: one Conversation per file.

A turn starts at a speaker line, in any of these forms:

- ``Name: text`` (a colon followed by a space or the end of the line),
- ``**Name:** text`` or ``**Name**: text``,
- a heading ``## Name`` … ``###### Name`` (optionally ``Name:``), the text following on the
  next lines.

``Name`` is 1-4 words of at most 40 characters starting with a letter (so URLs, times and
sentences are not taken for speakers). Every other line continues the current turn (blank lines
keep paragraphs); lines inside fenced code blocks are never speaker lines; lines before the
first turn are ignored, except that a ``# Title`` heading (or a ``title:`` in leading ``---``
front matter) names the conversation, which is otherwise named after the file. Horizontal rules
are dropped. ``User``/``Human`` become speaker ``"user"`` and ``Assistant``/``AI`` become
``"assistant"`` (any case); other names are kept as written.

Timestamps: none, unless a line starts with an ISO 8601 date or date-time (optionally in
``[...]``, optionally followed by ``-``/``|``), either on a speaker line
(``2024-05-01 09:30 Alice: hi``) or alone on a line (or as a heading, ``## 2024-05-01``). A date
stays in force until the next one: it dates its own turn and the following undated turns (so
times never run backwards). Datetimes are aware only when the text has an offset or ``Z``.
``Turn.source_id`` is ``"line:<n>"``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from inferscale_core.importers._common import Source, as_path, iter_lines, parse_iso
from inferscale_core.importers._sniff import Sample
from inferscale_core.types import Conversation, Turn

FORMAT = "markdown"
_NAME = r"[^\W\d_](?:[\w'’.()\-]|[ ](?=[^\s:*]))*"
_DATE = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]{1,9})?)?"
    r"(?:\s?(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?))?)?"
)
_DATED = re.compile(rf"\s*\[?(?P<date>{_DATE})\]?(?:\s*[-–—|]\s*|\s+|$)(?P<rest>.*)")
_HEADING_SPEAKER = re.compile(rf"#{{2,6}}\s+(?P<name>{_NAME})\s*:?\s*#*\s*")
_HEADING_DATE = re.compile(rf"#{{2,6}}\s+\[?(?P<date>{_DATE})\]?\s*#*\s*")
_BOLD_SPEAKER = re.compile(rf"\*\*(?P<name>{_NAME})(?::\*\*|\*\*:)(?:\s+(?P<text>.*))?")
_PLAIN_SPEAKER = re.compile(rf"(?P<name>{_NAME}):(?:\s+(?P<text>.*))?")
_TITLE = re.compile(r"#\s+(?P<title>.+?)\s*#*\s*")
_RULE = re.compile(r"\s*(?:-{3,}|\*{3,}|_{3,})\s*")
_FENCE = re.compile(r"\s*(?:```|~~~)")
_MAX_NAME_CHARS = 40
_MAX_NAME_WORDS = 4
_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}


@dataclass(frozen=True, slots=True)
class _Line:
    """One classified line."""

    kind: str  # "turn", "date", "title", "rule", "fence", "text"
    name: str = ""
    text: str = ""
    date: str | None = None


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` reads like a ``Name: text`` transcript, else why it does not."""
    if sample.text is None:
        return sample.text_problem or "not text"
    speakers = 0
    first_content: str | None = None
    in_fence = False
    for line in _skip_front_matter(list(sample.lines)):
        parsed = _classify(line, in_fence)
        if parsed.kind == "fence":
            in_fence = not in_fence
        if parsed.kind == "turn":
            speakers += 1
        if first_content is None and parsed.kind not in ("title", "rule", "date") and line.strip():
            first_content = parsed.kind
    if speakers >= 2 or first_content == "turn":
        return None
    return (
        f"found {speakers} speaker line(s) in the first 64 KB; a transcript needs lines like "
        f"'Name: text', '**Name:** text' or '### Name' (at least two, or one to begin with)"
    )


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """Read a Markdown / plain-text transcript as one conversation."""
    src = Source(as_path(path), FORMAT)
    title: str | None = None
    turns: list[Turn] = []
    lines: list[str] = []  # text lines of the current turn
    current: Turn | None = None
    day: datetime | None = None  # the date in force, for the following undated turns
    in_fence = False
    front = _FrontMatter()
    for lineno, line in iter_lines(src):
        if front.consume(lineno, line):
            continue
        parsed = _classify(line, in_fence)
        if parsed.kind == "fence":
            in_fence = not in_fence
        if parsed.kind == "turn":
            if current is not None:
                _close(current, lines, turns)
            if parsed.date:
                day = parse_iso(parsed.date, src, f"line {lineno}")
            current = Turn(_speaker(parsed.name), "", day, f"line:{lineno}")
            lines = [parsed.text]
        elif parsed.kind == "date":
            day = parse_iso(parsed.date, src, f"line {lineno}")
        elif parsed.kind == "title" and current is None:
            title = title or parsed.text
        elif parsed.kind != "rule" and current is not None:
            lines.append(line)
    if current is not None:
        _close(current, lines, turns)
    yield Conversation(
        title=front.title or title or src.path.stem or "Transcript",
        turns=turns,
        source=FORMAT,
    )


class _FrontMatter:
    """Skips a leading ``---`` … ``---`` block and remembers its ``title:``."""

    __slots__ = ("open", "title")

    def __init__(self) -> None:
        self.open: bool | None = None  # None: not decided yet (before the first line)
        self.title: str | None = None

    def consume(self, lineno: int, line: str) -> bool:
        """True when ``line`` belongs to the front matter."""
        if self.open is None:
            self.open = lineno == 1 and line.strip() == "---"
            return self.open
        if not self.open:
            return False
        if line.strip() in ("---", "..."):
            self.open = False
        elif line.lower().startswith("title:"):
            self.title = line[6:].strip().strip("\"'") or None
        return True


def _skip_front_matter(lines: list[str]) -> list[str]:
    if lines and lines[0].strip() == "---":
        for index in range(1, len(lines)):
            if lines[index].strip() in ("---", "..."):
                return lines[index + 1 :]
        return []
    return lines


def _classify(line: str, in_fence: bool) -> _Line:
    if _FENCE.match(line):
        return _Line("fence")
    if in_fence:
        return _Line("text")
    if _RULE.fullmatch(line):
        return _Line("rule")
    stripped = line.strip()
    heading_date = _HEADING_DATE.fullmatch(stripped)
    if heading_date:
        return _Line("date", date=heading_date["date"])
    date = None
    rest = stripped
    dated = _DATED.fullmatch(stripped)
    if dated:
        date, rest = dated["date"], dated["rest"].strip()
        if not rest:
            return _Line("date", date=date)
    for pattern in (_HEADING_SPEAKER, _BOLD_SPEAKER, _PLAIN_SPEAKER):
        match = pattern.fullmatch(rest)
        if match and _name_ok(match["name"]):
            text = match.groupdict().get("text") or ""
            return _Line("turn", name=match["name"], text=text, date=date)
    title = _TITLE.fullmatch(stripped)
    if title and not date:
        return _Line("title", text=title["title"])
    return _Line("text")


def _name_ok(name: str) -> bool:
    return len(name) <= _MAX_NAME_CHARS and len(name.split()) <= _MAX_NAME_WORDS


def _speaker(name: str) -> str:
    return _ROLES.get(name.lower(), name)


def _close(turn: Turn, lines: list[str], turns: list[Turn]) -> None:
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines).strip())
    if text:
        turn.text = text
        turns.append(turn)
