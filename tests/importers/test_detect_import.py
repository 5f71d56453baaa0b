"""Format detection by content, and the errors for files that are not exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale_core.importers import (
    FORMATS,
    MalformedExportError,
    UnsupportedExportError,
    detect_format,
    parse_file,
)

from ._helpers import FIXTURES

EXPECTED = {
    "chatgpt/conversations.json": "chatgpt",
    "claude/conversations.json": "claude",
    "claude/claude_export.jsonl": "claude",
    "claude/attachments.json": "claude",
    "jsonl/chat.jsonl": "jsonl",
    "jsonl/grouped.jsonl": "jsonl",
    "locomo/locomo_mini.json": "locomo",
    "markdown/transcript.md": "markdown",
    "markdown/notes.txt": "markdown",
    "memories/memories.json": "memories",
    "whatsapp/WhatsApp Chat - Alice Smith/_chat.txt": "whatsapp",
    "whatsapp/WhatsApp Chat with Familia.txt": "whatsapp",
    "whatsapp/android_us.txt": "whatsapp",
}


@pytest.mark.parametrize(("name", "fmt"), sorted(EXPECTED.items()))
def test_every_fixture_detected(name: str, fmt: str) -> None:
    assert detect_format(FIXTURES / name) == fmt


@pytest.mark.parametrize(("name", "fmt"), sorted(EXPECTED.items()))
def test_detection_ignores_misleading_names(tmp_path: Path, name: str, fmt: str) -> None:
    misleading = tmp_path / ("conversations.json" if fmt != "chatgpt" else "_chat.txt")
    misleading.write_bytes((FIXTURES / name).read_bytes())
    assert detect_format(misleading) == fmt


def test_all_fixtures_are_covered() -> None:
    on_disk = {
        p.relative_to(FIXTURES).as_posix()
        for p in FIXTURES.rglob("*")
        if p.is_file() and "ambiguous" not in p.name
    }
    assert on_disk == set(EXPECTED)


def test_unknown_format_names_every_format_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "shopping.txt"
    path.write_text("eggs\nmilk\nflour\n", encoding="utf-8")
    with pytest.raises(UnsupportedExportError) as info:
        detect_format(path)
    message = str(info.value)
    assert str(path) in message
    for fmt in FORMATS:
        assert f"- {fmt}: " in message
    assert set(info.value.reasons) == set(FORMATS)
    assert "is not a WhatsApp message header" in info.value.reasons["whatsapp"]
    assert "found 0 speaker line(s)" in info.value.reasons["markdown"]
    first = message.splitlines()[0]  # what the app shows: what is wrong and what to do
    assert "not a supported chat export" in first and "conversations.json" in first
    assert "Markdown" in first and "JSON Lines" in first
    assert "parse_file" not in message and "fmt=" not in message  # no developer API


def test_unknown_json_array_lists_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"name": "x", "price": 3}]), encoding="utf-8")
    with pytest.raises(UnsupportedExportError) as info:
        parse_file(path)
    reasons = info.value.reasons
    assert "'name', 'price'" in reasons["chatgpt"] and "'mapping'" in reasons["chatgpt"]
    assert "no 'chat_messages'" in reasons["claude"]
    assert "'qa'" in reasons["locomo"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "empty"),
        (b"  \n\t\n", "empty"),
        (b"\x00\x01\x02binary\xff" * 50, "NUL bytes"),
        (b"\xff\xfe" * 500, "not UTF-8 text"),
        (b"{not json at all", "first line is not a JSON value"),
        (b"[1, 2, 3]", "numbers, not conversation objects"),
    ],
)
def test_garbage_is_unsupported(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(content)
    with pytest.raises(UnsupportedExportError, match=fragment):
        detect_format(path)


def test_empty_array_parses_to_nothing(tmp_path: Path) -> None:
    for name, fmt in [
        ("conversations.json", "chatgpt"),
        ("locomo.json", "locomo"),
        ("x.json", "chatgpt"),
    ]:
        path = tmp_path / name
        path.write_text("[]")
        assert detect_format(path) == fmt
        assert list(parse_file(path)) == []


def test_forced_format_and_unknown_format_name(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("Alice: hi\n", encoding="utf-8")
    assert [t.speaker for c in parse_file(path, fmt="markdown") for t in c.turns] == ["Alice"]
    with pytest.raises(MalformedExportError, match="invalid JSON") as info:
        list(parse_file(path, fmt="chatgpt"))
    assert info.value.location == "start of file"
    path.write_text('{"a": 1}')
    with pytest.raises(MalformedExportError, match="the top level is an object"):
        list(parse_file(path, fmt="chatgpt"))
    with pytest.raises(ValueError, match="unknown format 'icq'"):
        parse_file(path, fmt="icq")


def test_chatgpt_with_huge_first_conversation_detected_from_head(tmp_path: Path) -> None:
    """The head is 64 KB; `current_node` comes after a long mapping, the node keys suffice."""
    conv = json.loads((FIXTURES / "chatgpt" / "conversations.json").read_text("utf-8"))[0]
    conv["mapping"]["u-1"]["message"]["content"]["parts"] = ["x" * 200_000]
    path = tmp_path / "export.bin"
    path.write_text(json.dumps([conv]), encoding="utf-8")
    assert detect_format(path) == "chatgpt"
    assert len(next(parse_file(path)).turns[0].text) == 200_000


def test_deep_nesting_is_malformed_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    depth = 1_000_000
    path.write_bytes(b'[{"mapping": {}, "current_node": ' + b"[" * depth + b"]" * depth + b"}]")
    assert detect_format(path) == "chatgpt"
    with pytest.raises(MalformedExportError, match="nested deeper than"):
        list(parse_file(path))
    brackets = tmp_path / "brackets.json"
    brackets.write_bytes(b"[" * depth)
    with pytest.raises(UnsupportedExportError, match="nested deeper than"):
        detect_format(brackets)
    with pytest.raises(MalformedExportError, match="nested deeper than"):
        list(parse_file(brackets, fmt="locomo"))
    lines = tmp_path / "deep.jsonl"
    lines.write_bytes(b'{"role": "user", "content": ' + b"[" * 100_000 + b"\n")
    with pytest.raises((MalformedExportError, UnsupportedExportError)):
        list(parse_file(lines))
    with pytest.raises(MalformedExportError, match="nested too deeply"):
        list(parse_file(lines, fmt="jsonl"))


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "nope.json")


def test_file_name_breaks_a_content_tie(tmp_path: Path) -> None:
    both = [{"mapping": {}, "current_node": "x", "chat_messages": []}]
    for name, fmt in [
        ("conversations.json", "chatgpt"),
        ("claude.jsonl", "claude"),
        ("whatever.json", "chatgpt"),
    ]:
        path = tmp_path / name
        path.write_text(json.dumps(both), encoding="utf-8")
        assert detect_format(path) == fmt


BIG = "1" * 3000  # too big for int64 (yajl) but within json's 4300-digit limit


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        (
            "conversations.json",
            f'[{{"mapping": {{}}, "current_node": "x", "conversation_id": {BIG}}}]',
            "integer overflow",
        ),
        ("l.json", f'[{{"qa": [], "conversation": {{}}, "sample_id": {BIG}}}]', "overflow"),
        (
            "c.jsonl",
            f'{{"role": "user", "content": "x", "conversation_id": {BIG}}}',
            "'conversation_id' is an integer of 9963 bits",
        ),
        (
            "c.jsonl",
            f'{{"role": "user", "content": "x", "timestamp": {BIG}}}',
            "timestamp <an integer of 9963 bits> is out of range",
        ),
    ],
)
def test_huge_integers_are_malformed(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MalformedExportError, match=fragment):
        list(parse_file(path))


def test_integer_beyond_pythons_digit_limit(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(f'{{"role": "user", "content": "x", "id": {"9" * 5000}}}\n', encoding="utf-8")
    with pytest.raises(UnsupportedExportError, match="Exceeds the limit"):
        detect_format(path)  # the first line is not readable JSON
    with pytest.raises(MalformedExportError, match="invalid JSON"):
        list(parse_file(path, fmt="jsonl"))
