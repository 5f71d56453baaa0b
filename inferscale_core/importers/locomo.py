"""LoCoMo benchmark file (``locomo10.json``): one Conversation per *session*.

The file is a JSON array of samples ``{sample_id, conversation, qa, ...}`` (streamed one at a
time). ``conversation`` holds ``speaker_a``, ``speaker_b``, ``session_<n>`` (a list of turns
``{speaker, dia_id, text, img_url?, blip_caption?}``) and ``session_<n>_date_time`` (like
``"1:56 pm on 8 May, 2023"``). Sessions are taken from the ``session_<n>`` lists in numeric
order (some samples have more date keys than sessions). Only the conversation is imported; the
QA, summaries and observations are not.

Each session becomes ``Conversation(title="<a> & <b> — session <n>",
source_id="<sample_id>/session_<n>")``. Every turn is kept (none is empty in the real file);
a turn with ``blip_caption`` gets ``" [shares a photo: <caption>]"`` appended. All turns of a
session carry the session's date-time as a *naive* datetime (the file gives no time zone), and
``dia_id`` as ``source_id``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime

from inferscale_core.importers._common import (
    Source,
    as_path,
    expect_dict,
    expect_list,
    iter_json_array,
    optional_id,
    optional_str,
    short,
)
from inferscale_core.importers._sniff import Sample, describe_keys
from inferscale_core.types import Conversation, Turn

FORMAT = "locomo"
_SESSION_KEY = re.compile(r"session_(\d{1,6})")
_DATE_TIME = re.compile(
    r"(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([a-z]+),?\s+(\d{4})", re.IGNORECASE
)
_MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` looks like a LoCoMo file, else why it does not."""
    head = sample.json
    if head is None or head.top != "array":
        return "not a JSON array (a LoCoMo file starts with '[')"
    if head.empty:
        return "the JSON array is empty"
    keys = head.record_keys()
    inner = head.record_keys("conversation")
    if "conversation" in keys and ("qa" in keys or "speaker_a" in inner or "session_1" in inner):
        return None
    if head.problem:
        return head.problem
    return (
        f"the first item has {describe_keys(keys)}, but a LoCoMo sample has 'conversation' "
        f"(with speaker_a/speaker_b/session_<n>) and 'qa'"
    )


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """Stream the sessions of a LoCoMo file as conversations."""
    src = Source(as_path(path), FORMAT)
    for index, item in iter_json_array(src, "sample"):
        yield from _sessions(src, index, item)


def parse_date_time(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` as a naive datetime. Raises ValueError if it is not one."""
    match = _DATE_TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{short(text)} is not like '1:56 pm on 8 May, 2023'")
    hour, minute, half, day, month_name, year = match.groups()
    month_name = month_name.lower()
    months = [number for number, name in enumerate(_MONTHS, 1) if name.startswith(month_name)]
    if len(month_name) < 3 or len(months) != 1:
        raise ValueError(f"unknown month {short(month_name)}")
    hour_24 = int(hour) % 12 + (12 if half.lower() == "p" else 0)
    if not 1 <= int(hour) <= 12:
        raise ValueError(f"hour {hour} is not a 12-hour clock hour")
    return datetime(int(year), months[0], int(day), hour_24, int(minute))


def _sessions(src: Source, index: int, item: object) -> Iterator[Conversation]:
    where = f"sample at index {index}"
    sample = expect_dict(item, src, where, "the sample")
    sample_id = optional_id(sample.get("sample_id"), src, where, "'sample_id'")
    if sample_id is None:
        raise src.error(where, "'sample_id' is missing")
    where = f"sample {short(sample_id, 40)}"
    conv = expect_dict(sample.get("conversation"), src, where, "'conversation'")
    speakers = [
        optional_str(conv.get(key), src, where, f"'{key}'") or "?"
        for key in ("speaker_a", "speaker_b")
    ]
    sessions = sorted(
        (int(match.group(1)), key)
        for key in conv
        if (match := _SESSION_KEY.fullmatch(key)) and conv[key] is not None
    )
    for number, key in sessions:
        session_where = f"{where}, {key}"
        turns_in = expect_list(conv[key], src, session_where, f"'{key}'")
        when = _session_time(src, session_where, conv.get(f"{key}_date_time"))
        turns = [
            _turn(src, f"{session_where}, turn {position}", turn, when)
            for position, turn in enumerate(turns_in)
        ]
        yield Conversation(
            title=f"{speakers[0]} & {speakers[1]} — session {number}",
            turns=turns,
            source=FORMAT,
            source_id=f"{sample_id}/{key}",
        )


def _session_time(src: Source, where: str, value: object) -> datetime | None:
    text = optional_str(value, src, where, "the session date_time")
    if text is None:
        return None
    try:
        return parse_date_time(text)
    except ValueError as exc:
        raise src.error(where, f"session date_time: {exc}") from None


def _turn(src: Source, where: str, item: object, when: datetime | None) -> Turn:
    turn = expect_dict(item, src, where, "the turn")
    speaker = optional_str(turn.get("speaker"), src, where, "'speaker'")
    if speaker is None:
        raise src.error(where, "'speaker' is missing")
    text = optional_str(turn.get("text"), src, where, "'text'") or ""
    caption = optional_str(turn.get("blip_caption"), src, where, "'blip_caption'")
    if caption and caption.strip():
        text = f"{text} [shares a photo: {caption.strip()}]".strip()
    return Turn(
        speaker=speaker,
        text=text,
        timestamp=when,
        source_id=optional_id(turn.get("dia_id"), src, where, "'dia_id'"),
    )
