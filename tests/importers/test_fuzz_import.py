"""Fuzzing: no input bytes may make the importers raise anything but their two errors.

Every example writes a mutated file and consumes ``parse_file`` completely, both with format
detection and with the format forced (so the parsers also see input detection would reject).
Only :class:`UnsupportedExportError` and :class:`MalformedExportError` may escape.

``INFERSCALE_FUZZ_EXAMPLES`` sets the examples *per format* (default 300, split between that
format's two fuzz tests; the random-bytes test gets half as many). Long run::

    INFERSCALE_FUZZ_EXAMPLES=10000 python -m pytest tests/importers/test_fuzz_import.py -q
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferscale_core.importers import (
    FORMATS,
    MalformedExportError,
    UnsupportedExportError,
    detect_format,
    memories,
    parse_file,
)
from inferscale_core.types import Conversation, Turn

from ._helpers import FIXTURES

EXAMPLES_PER_FORMAT = int(os.environ.get("INFERSCALE_FUZZ_EXAMPLES", "300"))
PER_TEST = max(1, EXAMPLES_PER_FORMAT // 2)

FUZZ = settings(
    max_examples=PER_TEST,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

SEEDS: dict[str, list[Path]] = {
    "chatgpt": [FIXTURES / "chatgpt" / "conversations.json"],
    "claude": [
        FIXTURES / "claude" / "conversations.json",
        FIXTURES / "claude" / "claude_export.jsonl",
    ],
    "locomo": [FIXTURES / "locomo" / "locomo_mini.json"],
    "jsonl": [FIXTURES / "jsonl" / "chat.jsonl", FIXTURES / "jsonl" / "grouped.jsonl"],
    "whatsapp": [
        FIXTURES / "whatsapp" / "WhatsApp Chat - Alice Smith" / "_chat.txt",
        FIXTURES / "whatsapp" / "WhatsApp Chat with Familia.txt",
        FIXTURES / "whatsapp" / "android_us.txt",
    ],
    "markdown": [FIXTURES / "markdown" / "transcript.md", FIXTURES / "markdown" / "notes.txt"],
    "memories": [FIXTURES / "memories" / "memories.json"],
}
JSON_FORMATS = ("chatgpt", "claude", "locomo", "jsonl", "memories")

#: Byte strings worth inserting: JSON syntax, bad UTF-8, WhatsApp marks, numbers out of range.
TOKENS = [
    b'"', b"{", b"}", b"[", b"]", b",", b":", b"\\", b"\\u", b"\\ud800", b"null", b"true",
    b"1e999", b"-1e400", b"99999999999999999999999", b"NaN", b"\x00", b"\xff", b"\xc3",
    b"\xe2\x80\x8e", b"\xe2\x80\xaf", b"\xef\xbb\xbf", b"\n", b"\r\n", b"\r", b": ", b" - ",
    b"[99/99/99, 99:99:99 PM] ", b"31/02/2023, 25:61 - ", b"0/0/0000, 0:00 - X: ",
    b"**A:** ", b"### B\n", b"```\n", b"2024-13-45T99:99 ", b"<Media omitted>", b"1" * 5000,
]  # fmt: skip

#: Field names of the formats, so random objects hit real code paths.
KEYS = [
    "mapping", "current_node", "parent", "children", "message", "content", "parts", "author",
    "role", "create_time", "weight", "metadata", "is_visually_hidden_from_conversation",
    "recipient", "text", "title", "id", "conversation_id", "chat_messages", "sender", "type",
    "created_at", "uuid", "name", "speaker", "timestamp", "conversation", "qa", "sample_id",
    "speaker_a", "speaker_b", "session_1", "session_1_date_time", "dia_id", "blip_caption",
    "facts", "exported_at", "refers_to", "profile",
]  # fmt: skip

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(KEYS + ["1:56 pm on 8 May, 2023", "2024-02-30T10:00:00Z", "human"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def consume(path: Path, fmt: str | None = None) -> None:
    """Parse ``path`` completely (a memory export's facts too); only the two importer errors
    may escape."""
    try:
        fmt = fmt or detect_format(path)
        for conv in parse_file(path, fmt):
            assert isinstance(conv, Conversation) and isinstance(conv.title, str)
            for turn in conv.turns:
                assert isinstance(turn, Turn)
                assert isinstance(turn.speaker, str) and isinstance(turn.text, str)
                assert turn.timestamp is None or isinstance(turn.timestamp, datetime)
        if fmt == memories.FORMAT:
            for fact in memories.parse_facts(path):
                assert isinstance(fact.text, str) and fact.text.strip()
    except (UnsupportedExportError, MalformedExportError) as exc:
        assert str(exc)  # the message can be built


def check_both_ways(path: Path, fmt: str) -> None:
    consume(path)
    consume(path, fmt)


@st.composite
def mutated_bytes(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        size = len(data)
        op = draw(st.sampled_from(["flip", "delete", "insert", "token", "truncate", "dup"]))
        at = draw(st.integers(0, size))
        if op == "flip" and size:
            at = min(at, size - 1)
            data[at] ^= draw(st.integers(1, 255))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS)) * draw(st.integers(1, 3))
        elif op == "truncate":
            del data[at:]
        elif op == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 256))]
    return bytes(data)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_byte_mutations(tmp_path: Path, fmt: str) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        seed = data.draw(st.sampled_from(SEEDS[fmt]))
        path = tmp_path / seed.name
        path.write_bytes(data.draw(mutated_bytes(seed.read_bytes())))
        check_both_ways(path, fmt)

    run()


def _load_records(seed: Path) -> tuple[object, bool]:
    """The seed as JSON: a list (array file) or the list of line objects (JSON Lines)."""
    text = seed.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text), False
    if seed.parent.name == "memories":  # one object
        return json.loads(text), False
    return [json.loads(line) for line in text.splitlines() if line.strip()], True


def _replace_somewhere(data: st.DataObject, value: object) -> object:
    """Walk down ``value`` at random and replace, delete or add something there."""
    if isinstance(value, dict | list) and value and data.draw(st.integers(0, 4)) > 0:
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        key = data.draw(st.sampled_from(keys))
        action = data.draw(st.sampled_from(["descend", "descend", "descend", "delete", "add"]))
        if action == "delete":
            del value[key]
        elif action == "add" and isinstance(value, dict):
            value[data.draw(st.sampled_from(KEYS))] = data.draw(JSON_VALUES)
        elif action == "add":
            value.insert(key, data.draw(JSON_VALUES))
        else:
            value[key] = _replace_somewhere(data, value[key])
        return value
    return data.draw(JSON_VALUES)


@pytest.mark.parametrize("fmt", JSON_FORMATS)
def test_fuzz_json_values(tmp_path: Path, fmt: str) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        seed = data.draw(st.sampled_from(SEEDS[fmt]))
        records, as_lines = _load_records(seed)
        for _ in range(data.draw(st.integers(1, 3))):
            records = _replace_somewhere(data, records)
        if as_lines and isinstance(records, list):
            text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
        else:
            text = json.dumps(records, ensure_ascii=False)
        path = tmp_path / seed.name
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        check_both_ways(path, fmt)

    run()


NAMES = st.sampled_from(["Ana", "Bob Ray", "~\u202fZoe", "+1 555 0100", "", " ", "A:B"])
NUMBER = st.integers(0, 99) | st.integers(0, 99999)
WHATSAPP_LINE = st.one_of(
    st.builds(
        "\u200e[{}/{}/{}, {}:{:02d}:{:02d}{}] {}: {}".format,
        NUMBER, NUMBER, NUMBER, NUMBER, st.integers(0, 99), st.integers(0, 99),
        st.sampled_from(["", " AM", "\u202fPM", " p.m."]), NAMES, st.text(max_size=30),
    ),
    st.builds(
        "{}/{}/{}, {}:{:02d}{} - {}: {}".format,
        NUMBER, NUMBER, NUMBER, NUMBER, st.integers(0, 99),
        st.sampled_from(["", " AM", " pm"]), NAMES,
        st.sampled_from(["<Media omitted>", "\u200eimage omitted", "hi", "null", ""]),
    ),
    st.text(max_size=40),
)  # fmt: skip


MARKDOWN_LINE = st.one_of(
    st.builds("{}: {}".format, NAMES, st.text(max_size=30)),
    st.builds("**{}:** {}".format, NAMES, st.text(max_size=30)),
    st.builds("### {}".format, NAMES),
    st.builds(
        "{}-{:02d}-{:02d}T{:02d}:{:02d} {}: hi".format,
        st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99),
        st.integers(0, 99), NAMES,
    ),
    st.sampled_from(["```", "---", "# Title", "## 2024-02-30", "", "title: x"]),
    st.text(max_size=40),
)  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "lines"), [("whatsapp", WHATSAPP_LINE), ("markdown", MARKDOWN_LINE)]
)
def test_fuzz_text_lines(tmp_path: Path, fmt: str, lines: st.SearchStrategy[str]) -> None:
    @FUZZ
    @given(st.lists(lines, min_size=1, max_size=12), st.sampled_from(["\n", "\r\n"]))
    def run(content: list[str], newline: str) -> None:
        path = tmp_path / ("_chat.txt" if fmt == "whatsapp" else "chat.md")
        path.write_bytes(newline.join(content).encode("utf-8", "surrogatepass"))
        check_both_ways(path, fmt)

    run()


def test_fuzz_random_bytes(tmp_path: Path) -> None:
    @FUZZ
    @given(
        st.binary(max_size=2048),
        st.sampled_from(["conversations.json", "_chat.txt", "x.jsonl", "a.md", "blob"]),
        st.sampled_from(FORMATS),
    )
    def run(content: bytes, name: str, fmt: str) -> None:
        path = tmp_path / name
        path.write_bytes(content)
        check_both_ways(path, fmt)

    run()
