"""A look at the first bytes of a file, shared by every format's ``check``.

:func:`take_sample` reads at most :data:`SNIFF_BYTES` and derives what the format checks need:
the text (if it is UTF-8), its complete lines, and for JSON the keys seen in the first record.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import ijson

from inferscale_core.importers._common import MAX_JSON_DEPTH, json_error_text, short

#: How much of a file detection reads.
SNIFF_BYTES = 64 * 1024

#: Stop collecting JSON keys after this many (a 64 KB head has at most a few thousand).
_MAX_KEYS = 5000

_BOM = b"\xef\xbb\xbf"

#: Invalid UTF-8 sequences tolerated in the head of a text file (more: not a text export).
_MAX_BAD_BYTES = 8


@dataclass(frozen=True, slots=True)
class JsonHead:
    """What the head of a JSON (or JSON Lines) file shows.

    ``keys`` holds ``(path, key)`` pairs of the first record, where ``path`` is the dotted key
    path *inside* that record (``""`` for its own keys, ``"mapping.abc"`` below it; array
    elements add ``"item"``).
    """

    top: str  # "array" or "object"
    record_type: str | None  # JSON type of the first record, None if none was seen
    empty: bool  # the top-level array is known to be empty
    keys: frozenset[tuple[str, str]]
    problem: str | None  # a JSON error inside the head (not just the head being cut short)

    def record_keys(self, path: str = "") -> frozenset[str]:
        """The keys seen at ``path`` inside the first record."""
        return frozenset(key for where, key in self.keys if where == path)

    def keys_below(self, prefix: str) -> frozenset[str]:
        """Keys seen at any path that starts with ``prefix``."""
        return frozenset(key for where, key in self.keys if where.startswith(prefix))


@dataclass(frozen=True, slots=True)
class Sample:
    """The head of a file as the format checks see it."""

    path: Path
    head: bytes
    complete: bool  # the head is the whole file
    text: str | None  # the head as text (BOM dropped); None when binary or not UTF-8
    text_problem: str | None  # why ``text`` is None
    lines: tuple[str, ...]  # complete lines of ``text`` (the last, maybe cut, line is dropped)
    json: JsonHead | None  # set when the head starts like JSON ("[" or "{")
    first_line_json: object  # the first non-blank line parsed as JSON, if that works
    first_line_problem: str | None  # why it did not (None when it did, or is cut short)

    @property
    def stripped(self) -> bytes:
        """The head without BOM and leading whitespace."""
        return self.head.removeprefix(_BOM).lstrip()

    @property
    def first_line(self) -> str | None:
        """The first non-blank line of the head, if any."""
        for line in self.lines:
            if line.strip():
                return line
        return None


def take_sample(path: Path) -> Sample:
    """Read the head of ``path`` and derive everything the checks use. OSError propagates."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES + 1)
    complete = len(head) <= SNIFF_BYTES
    head = head[:SNIFF_BYTES]
    text, text_problem = _decode(head, complete)
    lines: tuple[str, ...] = ()
    if text is not None:
        split = text.split("\n")
        if not complete:
            split = split[:-1]
        lines = tuple(line.rstrip("\r") for line in split)
    first_value: object = None
    first_problem: str | None = None
    body = head.removeprefix(_BOM).lstrip()
    json_head = None
    if body[:1] in (b"[", b"{"):
        json_head = _json_head(body, complete)
        first_value, first_problem = _first_line_json(lines)
    return Sample(
        path=path,
        head=head,
        complete=complete,
        text=text,
        text_problem=text_problem,
        lines=lines,
        json=json_head,
        first_line_json=first_value,
        first_line_problem=first_problem,
    )


def _decode(head: bytes, complete: bool) -> tuple[str | None, str | None]:
    if b"\x00" in head:
        return None, "it contains NUL bytes (a binary or UTF-16 file)"
    try:
        return head.decode("utf-8").removeprefix("\ufeff"), None
    except UnicodeDecodeError as exc:
        if not complete and exc.start >= len(head) - 3 and exc.reason == "unexpected end of data":
            return _decode(head[: exc.start], True)
        first_bad = exc.start
    # A few bad bytes in a text export (a mangled emoji) should be reported by the parser with
    # a line number, not make the whole file "unsupported": tolerate them here.
    text = head.decode("utf-8", "replace")
    if text.count("\ufffd") <= max(_MAX_BAD_BYTES, len(head) // 100):
        return text.removeprefix("\ufeff"), None
    return None, f"it is not UTF-8 text (byte 0x{head[first_bad]:02x} at offset {first_bad})"


def _first_line_json(lines: tuple[str, ...]) -> tuple[object, str | None]:
    for line in lines:
        if line.strip():
            try:
                return json.loads(line), None
            except RecursionError:
                return None, "its first line is nested too deeply"
            except ValueError as exc:
                return None, f"its first line is not a JSON value ({exc})"
    return None, None  # no complete line in the head


def _json_head(body: bytes, complete: bool) -> JsonHead:
    """Walk the events of the head and collect the keys of the first record.

    The walk uses ``basic_parse`` (no prefixes, linear memory) with a depth cap.
    """
    top = "array" if body[:1] == b"[" else "object"
    base = 1 if top == "array" else 0  # depth at which a record sits
    keys: set[tuple[str, str]] = set()
    labels: list[str] = []  # per open container: the key (or "item") of its current child
    record_type: str | None = None
    empty = False
    problem: str | None = None
    events = ijson.basic_parse(io.BytesIO(body), use_float=True, multiple_values=top == "object")
    try:
        for kind, value in events:
            depth = len(labels)
            if kind == "map_key":
                if depth - 1 >= base:
                    keys.add((".".join(labels[base : depth - 1]), str(value)))
                labels[-1] = str(value)
                if len(keys) >= _MAX_KEYS:
                    break
            elif kind in ("start_map", "start_array"):
                if depth == base and record_type is None:
                    record_type = "object" if kind == "start_map" else "array"
                if depth >= MAX_JSON_DEPTH:
                    problem = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
                    break
                labels.append("item")
            elif kind in ("end_map", "end_array"):
                labels.pop()
                if not labels and top == "array" and record_type is None:
                    empty = True
                if len(labels) == base:
                    break  # the first record is complete
            elif depth == base and record_type is None:
                record_type = _scalar_type(value)
                break
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        message = json_error_text(exc)
        if complete or "premature EOF" not in message:
            problem = f"invalid JSON ({message})"
    return JsonHead(top, record_type, empty, frozenset(keys), problem)


def _scalar_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    return "number"


def describe_keys(keys: frozenset[str], limit: int = 8) -> str:
    """A short listing of record keys for reasons (``{a, b, c, …}``)."""
    if not keys:
        return "no keys"
    names = sorted(keys)
    listed = ", ".join(short(name, 30) for name in names[:limit])
    return "{" + listed + (", …" if len(names) > limit else "") + "}"
