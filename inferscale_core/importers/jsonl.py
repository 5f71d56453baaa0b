"""Generic JSON Lines chat logs: one message object per line.

A line is ``{"role" | "speaker": str, "content" | "text": ..., "timestamp"?: ...}``. Content may
be a string or a list of strings / ``{"text": ...}`` blocks (OpenAI style), joined by newlines.
Blank lines are ignored; messages whose text is empty or null are skipped. Speakers are kept
as written (``"system"`` lines are kept too: a generic log is the user's own choice).

``timestamp`` may be ISO 8601 text (aware if it has an offset or ``Z``, else naive) or an epoch
number in seconds, read as UTC; numbers above 1e11 are taken as milliseconds.

One file is one Conversation titled after the file, unless lines carry ``conversation_id`` (or
``conversation``): then lines are grouped by it, conversations in order of first appearance and
turns in file order (lines without an id form a conversation of their own). Grouping needs the
whole file's turns in memory; JSON Lines logs are small next to the big JSON exports. A line's
``title`` names its conversation (the first one seen wins). ``Turn.source_id`` is the line's
``id`` when present, else ``"line:<n>"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from inferscale_core.importers._common import (
    Source,
    as_path,
    describe_type,
    expect_dict,
    iter_nonblank_json_lines,
    optional_id,
    optional_str,
    parse_timestamp,
)
from inferscale_core.importers._sniff import Sample, describe_keys
from inferscale_core.types import Conversation, Turn

FORMAT = "jsonl"
_SPEAKER_KEYS = ("role", "speaker")
_TEXT_KEYS = ("content", "text")
_GROUP_KEYS = ("conversation_id", "conversation")


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` looks like a generic JSON Lines chat log, else why not."""
    head = sample.json
    if head is None or head.top != "object":
        return "the file does not start with a JSON object ('{')"
    first = sample.first_line_json
    if first is None and sample.first_line_problem is None:
        keys = head.record_keys()  # the first line is longer than the head
    elif isinstance(first, dict):
        keys = frozenset(first)
    else:
        return sample.first_line_problem or "the first line is not a JSON object"
    if any(key in keys for key in _SPEAKER_KEYS) and any(key in keys for key in _TEXT_KEYS):
        return None
    return (
        f"the first line's object has {describe_keys(keys)}, expected 'role' or 'speaker' and "
        f"'content' or 'text'"
    )


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """Read a JSON Lines chat log into one conversation, or one per ``conversation_id``."""
    src = Source(as_path(path), FORMAT)
    groups: dict[str | None, Conversation] = {}
    titled: set[str | None] = set()
    for lineno, value in iter_nonblank_json_lines(src):
        where = f"line {lineno}"
        record = expect_dict(value, src, where, "the line")
        group = _group_id(src, where, record)
        conv = groups.get(group)
        if conv is None:
            conv = groups[group] = Conversation(
                title=_default_title(src, group), source=FORMAT, source_id=group
            )
        title = optional_str(record.get("title"), src, where, "'title'")
        if title and title.strip() and group not in titled:
            conv.title = title.strip()
            titled.add(group)
        turn = _turn(src, where, lineno, record)
        if turn is not None:
            conv.turns.append(turn)
    yield from groups.values()


def _group_id(src: Source, where: str, record: dict[str, object]) -> str | None:
    for key in _GROUP_KEYS:
        if record.get(key) is not None:
            return optional_id(record[key], src, where, f"'{key}'")
    return None


def _default_title(src: Source, group: str | None) -> str:
    return src.path.stem if group is None else f"{src.path.stem} — {group}"


def _turn(src: Source, where: str, lineno: int, record: dict[str, object]) -> Turn | None:
    speaker = _first_present(record, _SPEAKER_KEYS)
    if speaker is None:
        raise src.error(where, "no 'role' or 'speaker'")
    if not isinstance(speaker, str) or not speaker.strip():
        raise src.error(where, f"the speaker is {describe_type(speaker)}, expected a name")
    text = _text(src, where, _first_present(record, _TEXT_KEYS))
    if not text:
        return None
    source_id = optional_id(record.get("id"), src, where, "'id'")
    return Turn(
        speaker=speaker.strip(),
        text=text,
        timestamp=parse_timestamp(record.get("timestamp"), src, where),
        source_id=source_id if source_id is not None else f"line:{lineno}",
    )


def _first_present(record: dict[str, object], keys: tuple[str, ...]) -> object:
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    return None


def _text(src: Source, where: str, content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        raise src.error(where, f"the content is {describe_type(content)}, expected text")
    texts: list[str] = []
    for number, block in enumerate(content):
        if isinstance(block, dict):
            text = optional_str(block.get("text"), src, where, f"'text' of block {number}")
        elif isinstance(block, str):
            text = block
        else:
            raise src.error(
                where, f"content block {number} is {describe_type(block)}, expected text"
            )
        if text and text.strip():
            texts.append(text.strip())
    return "\n".join(texts)
