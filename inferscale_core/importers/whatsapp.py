"""WhatsApp chat export (``_chat.txt`` / ``WhatsApp Chat with X.txt``): one file, one Conversation.

Message headers, the style fixed per file by its first header:

- iOS: ``[12/31/23, 9:41:05 PM] Name: text`` (brackets, seconds; U+200E marks and a U+202F
  narrow no-break space before AM/PM are common)
- Android: ``31/12/2023, 21:41 - Name: text`` or ``12/31/23, 9:41 PM - Name: text``

Dates may use ``/``, ``.`` or ``-``; a 4-digit first field means year-month-day. Lines without a
header continue the previous message (multi-line messages). Header lines without ``Name:`` are
system events and are skipped with their continuation lines, as are notices attributed to a
person: texts iOS starts with a U+200E mark (encryption notice, deleted messages, calls, group
events) and the known English notices ("Messages and calls are end-to-end encrypted…",
"This message was deleted", "Missed voice call", …). A trailing "<This message was edited>" is
removed. A leading "~" (non-contact group members) is dropped from names.

**Media** (``<Media omitted>``, ``image omitted``, ``<attached: 00000012-PHOTO-….jpg>``,
``IMG-….jpg (file attached)``): kept as a turn whose text is ``"[media omitted]"`` — the fact
that someone sent a photo at that moment can matter to a memory — followed by the caption
lines, if any.

**Day/month order**, decided per file from all headers (two passes over the file, no buffering):

1. a first field above 12 anywhere → day first; a second field above 12 → month first
   (both → MalformedExportError);
2. otherwise, if only one of the two readings keeps the dates in non-decreasing order (exports
   are chronological), that reading;
3. otherwise month first when the file uses a 12-hour clock (AM/PM) with 2-digit years (the US
   ``M/D/YY, h:mm AM`` locales of iOS and Android), else day first.

**Time zone**: WhatsApp writes the phone's local time with no zone, so timestamps are *naive*
datetimes; attaching a zone would be a guess.

Title: the chat name from the file name (``WhatsApp Chat with Alice.txt`` → ``Alice``; for
``_chat.txt`` the enclosing ``WhatsApp Chat - Alice`` folder), else the participants
(``Alice & Bob``). ``Turn.source_id`` is ``"line:<n>"`` (the header's line); the
conversation has no ``source_id`` (exports carry no chat id).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from inferscale_core.importers._common import Source, as_path, iter_lines, short
from inferscale_core.importers._sniff import Sample
from inferscale_core.types import Conversation, Turn

FORMAT = "whatsapp"
MEDIA_TEXT = "[media omitted]"

_MARKS = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\ufeff"
_DATE = r"(\d{1,4})[./-](\d{1,2})[./-](\d{1,4})"
_TIME = r"(\d{1,2})[:.](\d{2})(?:[:.](\d{2}))?(?:\s*([AaPp])\.?\s?[Mm]\.?)?"
_HEADERS = {
    "ios": re.compile(rf"[{_MARKS}]*\[{_DATE},?\s+{_TIME}\]\s?(.*)"),
    "android": re.compile(rf"[{_MARKS}]*{_DATE},?\s+{_TIME}\s+[-–]\s(.*)"),
}
_MEDIA = re.compile(
    r"<media omitted>|<attached: [^>]*>|.+ \(file attached\)"
    r"|(?:.*\u200e)?(?:image|video|audio|gif|sticker|document|contact card|video note) omitted",
    re.IGNORECASE,
)
_NOTICES = frozenset(
    {
        "this message was deleted",
        "you deleted this message",
        "missed voice call",
        "missed video call",
        "waiting for this message",
        "null",
    }
)
_NOTICE_PREFIXES = (
    "messages and calls are end-to-end encrypted",
    "messages to this group are now secured with end-to-end encryption",
)
_EDITED = re.compile(r"\s*\u200e?<This message was edited>\s*$")


@dataclass(frozen=True, slots=True)
class _Header:
    """A parsed message header line."""

    style: str
    first: str
    second: str
    third: str
    hour: int
    minute: int
    second_of_minute: int
    half: str | None  # "a" / "p" for a 12-hour clock
    rest: str  # "Name: text" or a system event

    @property
    def year_first(self) -> bool:
        return len(self.first) == 4


@dataclass(slots=True)
class _Scan:
    """What the first pass learns about the file."""

    style: str | None = None
    first_above_12: int | None = None  # line of a date whose first field is > 12
    second_above_12: int | None = None
    day_first_sorted: bool = True
    month_first_sorted: bool = True
    twelve_hour: bool = False
    short_years: bool = False
    participants: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    """The message being read (header plus continuation lines)."""

    lineno: int
    speaker: str | None  # None: a skipped system event / notice
    timestamp: datetime | None
    media: bool
    lines: list[str]


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` starts like a WhatsApp chat export, else why it does not."""
    if sample.text is None:
        return sample.text_problem or "not text"
    first = sample.first_line
    if first is None:
        return "no complete line of text in the first 64 KB"
    if _match_header(first) is not None:
        return None
    return (
        f"the first line {short(first)} is not a WhatsApp message header like "
        f"'[31/12/23, 21:41:05] Name: text' (iOS) or '31/12/2023, 21:41 - Name: text' (Android)"
    )


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """Read a WhatsApp chat export as one conversation."""
    src = Source(as_path(path), FORMAT)
    scan = _scan(src)
    day_first = _day_first(src, scan)
    conv = Conversation(title=_title(src.path, scan.participants), source=FORMAT)
    pending: _Pending | None = None
    for lineno, line in iter_lines(src):
        header = _match_header(line, scan.style)
        if header is None:
            if pending is not None:
                pending.lines.append(line)
            elif line.strip(_MARKS + " \t"):
                raise src.error(f"line {lineno}", "text before the first message header")
            continue
        if pending is not None and (turn := _finish(pending)) is not None:
            conv.turns.append(turn)
        pending = _start(src, lineno, header, day_first)
    if pending is not None and (turn := _finish(pending)) is not None:
        conv.turns.append(turn)
    yield conv


def parse_header(line: str) -> tuple[str, str] | None:
    """``(style, rest)`` if ``line`` is a WhatsApp message header, else ``None`` (for tests)."""
    header = _match_header(line)
    return None if header is None else (header.style, header.rest)


def _match_header(line: str, style: str | None = None) -> _Header | None:
    styles = (style,) if style else ("ios", "android")
    for name in styles:
        match = _HEADERS[name].fullmatch(line)
        if match is None:
            continue
        first, second, third, hour, minute, sec, half, rest = match.groups()
        four_first = len(first) == 4
        if four_first and len(third) > 2:
            continue
        if not four_first and (len(first) > 2 or len(third) not in (2, 4)):
            continue
        return _Header(
            style=name,
            first=first,
            second=second,
            third=third,
            hour=int(hour),
            minute=int(minute),
            second_of_minute=int(sec or 0),
            half=half.lower() if half else None,
            rest=rest,
        )
    return None


def _scan(src: Source) -> _Scan:
    """First pass: header style, evidence for the day/month order, participants."""
    scan = _Scan()
    previous_df: tuple[int, int, int] | None = None
    previous_mf: tuple[int, int, int] | None = None
    for lineno, line in iter_lines(src):
        header = _match_header(line, scan.style)
        if header is None:
            continue
        if scan.style is None:
            scan.style = header.style
            scan.twelve_hour = header.half is not None
            scan.short_years = len(header.third) == 2
        sender, text = _split_sender(header.rest)
        if sender is not None and _kind(text) != "notice" and sender not in scan.participants:
            scan.participants.append(sender)
        if header.year_first:
            continue
        a, b, year = int(header.first), int(header.second), int(header.third)
        if a > 12 and scan.first_above_12 is None:
            scan.first_above_12 = lineno
        if b > 12 and scan.second_above_12 is None:
            scan.second_above_12 = lineno
        day_first_key, month_first_key = (year, b, a), (year, a, b)
        if previous_df is not None and day_first_key < previous_df:
            scan.day_first_sorted = False
        if previous_mf is not None and month_first_key < previous_mf:
            scan.month_first_sorted = False
        previous_df, previous_mf = day_first_key, month_first_key
    return scan


def _day_first(src: Source, scan: _Scan) -> bool:
    """The day/month rule of the module docstring."""
    if scan.first_above_12 is not None and scan.second_above_12 is not None:
        raise src.error(
            f"lines {scan.first_above_12} and {scan.second_above_12}",
            "one date has a first field above 12 and another a second field above 12, so the "
            "dates are neither all day/month nor all month/day",
        )
    if scan.first_above_12 is not None:
        return True
    if scan.second_above_12 is not None:
        return False
    if scan.day_first_sorted != scan.month_first_sorted:
        return scan.day_first_sorted
    return not (scan.twelve_hour and scan.short_years)


def _start(src: Source, lineno: int, header: _Header, day_first: bool) -> _Pending:
    """Begin a message at a header line."""
    timestamp = _timestamp(src, lineno, header, day_first)
    sender, text = _split_sender(header.rest)
    kind = _kind(text) if sender is not None else "notice"
    if kind == "notice":
        return _Pending(lineno, None, timestamp, False, [])
    return _Pending(lineno, sender, timestamp, kind == "media", [text])


def _finish(pending: _Pending) -> Turn | None:
    """The turn for a complete message, or ``None`` when it is skipped or empty."""
    if pending.speaker is None:
        return None
    lines = pending.lines
    if pending.media:
        lines = [MEDIA_TEXT, *lines[1:]]
    text = _EDITED.sub("", "\n".join(lines)).strip()
    if not text:
        return None
    return Turn(
        speaker=pending.speaker,
        text=text,
        timestamp=pending.timestamp,
        source_id=f"line:{pending.lineno}",
    )


def _split_sender(rest: str) -> tuple[str | None, str]:
    """``("Name", "text")`` for ``"Name: text"``; ``(None, rest)`` for a system event."""
    name, colon, text = rest.partition(": ")
    if not colon:
        if not rest.endswith(":"):
            return None, rest
        name, text = rest[:-1], ""
    name = name.strip(_MARKS + " \t\u00a0\u202f").lstrip("~").strip(" \t\u00a0\u202f")
    if not name:
        return None, rest
    return name, text


def _kind(text: str) -> str:
    """``"media"``, ``"notice"`` (skipped) or ``"text"`` for a message's first line."""
    bare = text.strip(_MARKS + " \t")
    if _MEDIA.fullmatch(bare) or _MEDIA.fullmatch(text.strip()):
        return "media"
    if text.startswith("\u200e"):
        return "notice"  # iOS marks its own notices with U+200E
    lowered = bare.lower().rstrip(".")
    if lowered in _NOTICES or lowered.startswith(_NOTICE_PREFIXES):
        return "notice"
    return "text"


def _timestamp(src: Source, lineno: int, header: _Header, day_first: bool) -> datetime:
    if header.year_first:
        year, month, day = int(header.first), int(header.second), int(header.third)
    elif day_first:
        day, month, year = int(header.first), int(header.second), int(header.third)
    else:
        month, day, year = int(header.first), int(header.second), int(header.third)
    if len(header.third) == 2 and not header.year_first:
        year += 2000
    hour = header.hour
    if header.half is not None:
        if not 1 <= hour <= 12:
            raise src.error(f"line {lineno}", f"hour {hour} on a 12-hour (AM/PM) clock")
        hour = hour % 12 + (12 if header.half == "p" else 0)
    try:
        return datetime(year, month, day, hour, header.minute, header.second_of_minute)
    except ValueError as exc:
        order = (
            "year/month/day" if header.year_first else ("day/month" if day_first else "month/day")
        )
        raise src.error(
            f"line {lineno}", f"invalid date or time ({exc}) reading the date as {order}"
        ) from None


def _title(path: Path, participants: list[str]) -> str:
    named = _chat_name(path.stem)
    if named:
        return named
    if path.stem != "_chat" and path.stem.strip():
        return path.stem
    named = _chat_name(path.parent.name)
    if named:
        return named
    if participants:
        shown = " & ".join(participants[:3])
        return shown + (f" +{len(participants) - 3}" if len(participants) > 3 else "")
    return "WhatsApp chat"


def _chat_name(name: str) -> str | None:
    """``"Alice"`` for ``"WhatsApp Chat with Alice"`` / ``"WhatsApp Chat - Alice"``."""
    for prefix in ("WhatsApp Chat with ", "WhatsApp Chat - ", "WhatsApp Chat – "):
        if name.startswith(prefix) and name[len(prefix) :].strip():
            return name[len(prefix) :].strip()
    return None
