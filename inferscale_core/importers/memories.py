"""Our own ``memory export`` file: memories, not conversations.

``inferscale-assistant memory export`` writes ``{"profile", "exported_at", "facts": [{"id",
"text", "refers_to", "created_at", "source_turn_ids", "supersedes", "valid_until",
"ended_by"}]}``. Importing it (``import FILE --profile other``, or the inbox) adds each fact to
the target profile with its text, the day it is about (``refers_to``) and the time it was first
learnt (``created_at``); ids, source turns and what it replaced belong to the profile it came
from and are left out (its source turns are not in this file), as is ``valid_until`` (the fact
that ended it is not exported). So a user can move memories between profiles.

Idempotent: the pipeline skips a file whose bytes it imported already, and
:meth:`FactLog.add_fact` keeps one active fact per text in a profile (and does not bring back
one forgotten there), so importing the same facts again adds nothing. The whole file is checked
before any fact is added, and the facts are added in one transaction: a damaged export adds
nothing and is quarantined with its reason.

:func:`parse` yields no conversations (the registry's interface); :func:`parse_facts` reads the
facts, and the pipeline calls it for this format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TypeVar

from inferscale_core.importers._common import Source, as_path, describe_type, short
from inferscale_core.importers._sniff import Sample, describe_keys
from inferscale_core.types import Conversation

T = TypeVar("T")

FORMAT = "memories"
_KEYS = frozenset({"exported_at", "facts"})


@dataclass(frozen=True, slots=True)
class ExportedFact:
    """One exported memory, as it is added to the target profile."""

    text: str
    refers_to: date | None  # the day it is about
    created_at: datetime | None  # aware; when it was first learnt


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` looks like a ``memory export`` file, else why it does not."""
    head = sample.json
    if head is None or head.top != "object":
        return "not a JSON object (a memory export starts with '{')"
    keys = head.record_keys()
    if keys >= _KEYS:
        return None
    if head.problem:
        return head.problem
    return (
        f"the object has {describe_keys(keys)}, but a memory export has 'profile',"
        " 'exported_at' and 'facts'"
    )


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """No conversations: a memory export holds facts (:func:`parse_facts`)."""
    yield from ()


def parse_facts(path: str | os.PathLike[str]) -> list[ExportedFact]:
    """Every fact of the export at ``path``, checked; raises :class:`MalformedExportError`
    naming the first bad spot (nothing is returned then)."""
    src = Source(as_path(path), FORMAT)
    try:
        data = json.loads(src.path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise src.error(f"byte {exc.start}", "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise src.error(where, f"invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise src.error("top level", "JSON nested too deeply") from None
    except ValueError as exc:  # a number of more than 4,300 digits
        raise src.error("top level", f"invalid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("facts"), list):
        got = describe_type(data.get("facts")) if isinstance(data, dict) else describe_type(data)
        raise src.error("top level", f"'facts' must be a list of memories, got {got}")
    return [_fact(src, index, item) for index, item in enumerate(data["facts"])]


def _fact(src: Source, index: int, item: object) -> ExportedFact:
    where = f"facts[{index}]"
    if not isinstance(item, dict):
        raise src.error(where, f"a memory must be an object, got {describe_type(item)}")
    if isinstance(item.get("id"), int):
        where += f" (id {item['id']})"
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        got = "empty text" if isinstance(text, str) else describe_type(text)
        raise src.error(where, f"'text' must be the memory's text, got {got}")
    return ExportedFact(
        text.strip(),
        _when(src, where, item, "refers_to", date.fromisoformat),
        _when(src, where, item, "created_at", _aware),
    )


def _when(src: Source, where: str, item: dict, key: str, parse: Callable[[str], T]) -> T | None:
    value = item.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return parse(value)
    except ValueError:
        got = short(value) if isinstance(value, str) else describe_type(value)
        raise src.error(where, f"'{key}' is not an ISO date: {got}") from None


def _aware(text: str) -> datetime:
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
