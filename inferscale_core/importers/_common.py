"""Helpers shared by the format modules: streaming JSON, UTF-8 lines, timestamps, type checks.

Nothing here keeps state between calls. Every failure caused by file content is turned into a
:class:`MalformedExportError` that names the file, the place and the problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import ijson

from inferscale_core.importers.errors import MalformedExportError

#: Deepest JSON nesting accepted. Real exports nest < 20 deep; the limit keeps hostile input from
#: costing memory or recursion (see :func:`iter_json_array`).
MAX_JSON_DEPTH = 256

#: Epoch numbers above this are taken as milliseconds (1e11 s is the year 5138).
_MILLISECONDS_THRESHOLD = 1e11

#: Integers longer than this are not turned into text (``str`` of a huge int raises ValueError).
_MAX_ID_BITS = 1024

_OPENERS = frozenset({"start_map", "start_array"})
_CLOSERS = frozenset({"end_map", "end_array"})


@dataclass(frozen=True, slots=True)
class Source:
    """The file being parsed and its format, to build errors that name both."""

    path: Path
    fmt: str

    def error(self, location: str, problem: str) -> MalformedExportError:
        """Return (not raise) a :class:`MalformedExportError` for this file."""
        return MalformedExportError(self.path, self.fmt, location, problem)


def as_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a :class:`Path`."""
    return Path(os.fspath(path))


def describe_type(value: object) -> str:
    """A JSON-ish name for the type of ``value`` (for error messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def number_text(value: int | float) -> str:
    """``repr`` of a number, safe for integers too long for ``str`` (Python caps the digits)."""
    if isinstance(value, int) and value.bit_length() > _MAX_ID_BITS:
        return f"<an integer of {value.bit_length()} bits>"
    return repr(value)


def short(text: str, limit: int = 60) -> str:
    """``repr`` of ``text`` cut to about ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def json_error_text(exc: BaseException) -> str:
    """The first line of an ijson / json error, without the raw-byte excerpt yajl appends."""
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    first = str(text).strip().splitlines()
    message = first[0] if first else type(exc).__name__
    if "premature EOF" in message:
        message += " (the file looks truncated)"
    return message


# --------------------------------------------------------------------------------------- JSON


def iter_json_array(src: Source, what: str) -> Iterator[tuple[int, object]]:
    """Stream the items of the file's top-level JSON array as ``(index, item)``.

    Only one item is held as Python objects at a time. ``what`` names an item in errors
    ("conversation", "sample").

    This builds items from ``ijson.basic_parse`` events instead of calling
    ``ijson.items(f, "item")``: the prefix strings that ``ijson.parse``/``ijson.items`` attach to
    every event make memory grow with the *square* of the nesting depth (measured: 30,000 nested
    ``[`` cost 2.2 GB), so a 64 KB file of brackets could exhaust memory. Here depth is capped at
    :data:`MAX_JSON_DEPTH` and memory stays linear; the cost is ~2.5x ijson.items' time (about
    1.2 s for a 77 MB ChatGPT export).
    """
    where = "start of file"  # where a JSON syntax error would be
    with open(src.path, "rb") as f:
        if f.read(3) != b"\xef\xbb\xbf":  # skip a UTF-8 BOM, which yajl rejects
            f.seek(0)
        events = ijson.basic_parse(f, use_float=True)
        try:
            first = next(events, None)
            if first is None:
                raise src.error(where, "the file is empty, expected a JSON array")
            if first[0] != "start_array":
                raise src.error(
                    where,
                    f"the top level is {_event_kind(first)}, expected a JSON array of {what}s",
                )
            where = f"{what} at index 0"
            for index, item in enumerate(_build_items(events, src, what)):
                yield index, item
                where = f"{what} at index {index + 1}"
            where = "after the end of the top-level array"
            for event in events:  # anything but whitespace after the array is an error
                raise src.error(where, f"unexpected {event[0]}")
        except (ijson.JSONError, UnicodeDecodeError) as exc:
            raise src.error(where, f"invalid JSON: {json_error_text(exc)}") from None


def _event_kind(event: tuple[str, object]) -> str:
    kind = event[0]
    if kind == "start_map":
        return "an object"
    if kind == "start_array":
        return "an array"
    return describe_type(event[1])


def _build_items(events: Iterator[tuple[str, object]], src: Source, what: str) -> Iterator[object]:
    """Assemble each element of an already opened JSON array from basic_parse events."""
    stack: list[list[object] | dict[str, object]] = []
    keys: list[str | None] = []
    index = 0
    for kind, value in events:
        if kind == "map_key":
            keys[-1] = value  # type: ignore[assignment]
            continue
        if kind in _CLOSERS:
            if not stack:
                return  # the top-level array ended
            done = stack.pop()
            keys.pop()
            if not stack:
                yield done
                index += 1
            continue
        new: object
        if kind == "start_map":
            new = {}
        elif kind == "start_array":
            new = []
        else:
            new = value
        if stack:
            top = stack[-1]
            if isinstance(top, list):
                top.append(new)
            else:
                top[keys[-1]] = new  # type: ignore[index]
        elif kind not in _OPENERS:
            yield new
            index += 1
            continue
        if kind in _OPENERS:
            if len(stack) >= MAX_JSON_DEPTH:
                raise src.error(
                    f"{what} at index {index}", f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
                )
            stack.append(new)  # type: ignore[arg-type]
            keys.append(None)
    raise src.error(f"{what} at index {index}", "the JSON array is not closed")


def load_json_line(src: Source, lineno: int, line: str) -> object:
    """Parse one JSON Lines line (stdlib ``json``; it fails cleanly on deep nesting)."""
    try:
        return json.loads(line)
    except RecursionError:
        raise src.error(f"line {lineno}", "JSON nested too deeply") from None
    except ValueError as exc:
        raise src.error(f"line {lineno}", f"invalid JSON: {exc}") from None


def iter_nonblank_json_lines(src: Source) -> Iterator[tuple[int, object]]:
    """``(line number, parsed value)`` for each non-blank line of a JSON Lines file."""
    for lineno, line in iter_lines(src):
        if line.strip():
            yield lineno, load_json_line(src, lineno, line)


def first_significant_byte(path: Path) -> bytes:
    """The first byte of the file that is not whitespace or a UTF-8 BOM (``b""`` if none)."""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(65536)
            if not chunk:
                return b""
            stripped = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return stripped[:1]


# -------------------------------------------------------------------------------------- lines


def iter_lines(src: Source) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line, decoded as UTF-8, without the line ending.

    Lines are split on ``\\n`` only (``\\r\\n`` works too); U+2028 and friends stay inside a
    line. A leading BOM is dropped. Invalid UTF-8 raises :class:`MalformedExportError`.
    """
    with open(src.path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise src.error(
                    f"line {lineno}", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})"
                ) from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            yield lineno, line.rstrip("\r\n")


# --------------------------------------------------------------------------------- timestamps


def epoch_to_utc(
    value: object, src: Source, location: str, *, allow_milliseconds: bool = False
) -> datetime | None:
    """A JSON epoch-seconds number as an aware UTC datetime; ``None`` stays ``None``.

    With ``allow_milliseconds``, numbers above 1e11 are read as milliseconds.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise src.error(location, f"timestamp is {describe_type(value)}, expected a number")
    try:
        seconds = float(value)
        if allow_milliseconds and abs(seconds) > _MILLISECONDS_THRESHOLD:
            seconds /= 1000.0
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, ValueError, OSError):
        raise src.error(location, f"timestamp {number_text(value)} is out of range") from None


def parse_iso(value: object, src: Source, location: str) -> datetime | None:
    """An ISO 8601 string as a datetime (aware if the string has an offset or ``Z``).

    ``None`` stays ``None``; anything else that is not an ISO string is an error.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise src.error(location, f"timestamp is {describe_type(value)}, expected ISO 8601 text")
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        raise src.error(location, f"timestamp {short(value)} is not ISO 8601") from None


def parse_timestamp(value: object, src: Source, location: str) -> datetime | None:
    """An ISO 8601 string or an epoch number (seconds, or milliseconds above 1e11)."""
    if isinstance(value, str):
        return parse_iso(value, src, location)
    return epoch_to_utc(value, src, location, allow_milliseconds=True)


# -------------------------------------------------------------------------------- type checks


def expect_dict(value: object, src: Source, location: str, name: str) -> dict[str, object]:
    """``value`` if it is a JSON object, else a MalformedExportError."""
    if not isinstance(value, dict):
        raise src.error(location, f"{name} is {describe_type(value)}, expected an object")
    return value


def expect_list(value: object, src: Source, location: str, name: str) -> list[object]:
    """``value`` if it is a JSON array, else a MalformedExportError."""
    if not isinstance(value, list):
        raise src.error(location, f"{name} is {describe_type(value)}, expected an array")
    return value


def optional_str(value: object, src: Source, location: str, name: str) -> str | None:
    """``value`` if it is a string or null, else a MalformedExportError."""
    if value is None or isinstance(value, str):
        return value
    raise src.error(location, f"{name} is {describe_type(value)}, expected a string")


def optional_id(value: object, src: Source, location: str, name: str) -> str | None:
    """An id that may be a string or an integer, as a string; null stays ``None``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > _MAX_ID_BITS:
            raise src.error(location, f"{name} is an integer of {value.bit_length()} bits")
        return str(value)
    raise src.error(location, f"{name} is {describe_type(value)}, expected a string or integer")
