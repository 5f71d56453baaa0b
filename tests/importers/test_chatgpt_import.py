"""ChatGPT conversations.json: the current branch only, hidden/system/tool nodes skipped."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from inferscale_core.importers import MalformedExportError, chatgpt, detect_format, parse_file

from ._helpers import FIXTURES

EXPORT = FIXTURES / "chatgpt" / "conversations.json"


def _utc(*args: int, microsecond: int = 0) -> datetime:
    return datetime(*args, microsecond=microsecond, tzinfo=UTC)


def test_current_branch_turns_exactly() -> None:
    first, second = list(parse_file(EXPORT))
    assert first.title == "Trip planning: Lisbon"
    assert first.source == "chatgpt"
    assert first.source_id == "6632a1b0-0000-4000-8000-00000000000a"
    got = [(t.speaker, t.text, t.timestamp, t.source_id) for t in first.turns]
    assert got == [
        ("user", "I'm planning a trip to Lisbon in May. Any tips?", _utc(2024, 5, 1, 8), "u-1"),
        (
            "assistant",
            "Lisbon in May is lovely: book the tram 28 early and try pastéis de nata in Belém.",
            _utc(2024, 5, 1, 8, 0, 12, microsecond=500000),
            "a-1",
        ),
        ("user", "What about day trips by train?", _utc(2024, 5, 1, 8, 3, 20), "u-2-edited"),
        (
            "assistant",
            "Take the train from Rossio to Sintra (about 40 min), or from Cais do Sodré along "
            "the coast to Cascais.",
            _utc(2024, 5, 1, 8, 3, 50, microsecond=250000),
            "a-2-edited",
        ),
        # the image part is dropped, the text part kept
        ("user", "Is this the Sintra palace?", _utc(2024, 5, 1, 8, 5), "u-3"),
        # a dict part with "text" (audio transcription) is kept, the audio pointer dropped
        ("assistant", "Yes, that is the Pena Palace.", _utc(2024, 5, 1, 8, 5, 10), "a-3"),
    ]
    assert second.title == "Quick question"
    assert second.source_id == "conv-b-only-id"  # falls back to "id"
    assert [(t.speaker, t.text, t.timestamp) for t in second.turns] == [
        ("user", "How many ml in a US cup?", None),
        ("assistant", "About 236.6 ml.", _utc(2023, 11, 14, 22, 13, 20)),
    ]


def test_skipped_nodes_never_appear() -> None:
    ids = {t.source_id for c in parse_file(EXPORT) for t in c.turns}
    texts = " ".join(t.text for c in parse_file(EXPORT) for t in c.turns)
    # the other branch, system, hidden context, tool call, tool output, weight 0, empty text
    for node in (
        "u-2-original",
        "a-2-original",
        "sys-1",
        "ctx-1",
        "a-2-call",
        "t-1",
        "w-0",
        "a-4-empty",
    ):
        assert node not in ids
    assert "Sintra is a classic day trip" not in texts
    assert "Be brief" not in texts and "search(" not in texts


def test_timestamps_are_aware_utc() -> None:
    stamps = [t.timestamp for c in parse_file(EXPORT) for t in c.turns if t.timestamp]
    assert stamps and all(s.tzinfo is UTC for s in stamps)


def test_detected_by_content_when_renamed(tmp_path: Path) -> None:
    renamed = tmp_path / "foo.txt"
    renamed.write_bytes(EXPORT.read_bytes())
    assert detect_format(renamed) == "chatgpt"
    assert [c.title for c in parse_file(renamed)] == ["Trip planning: Lisbon", "Quick question"]


def test_split_export_name_and_minified(tmp_path: Path) -> None:
    data = json.loads(EXPORT.read_text(encoding="utf-8"))
    split = tmp_path / "conversations-002.json"
    split.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    assert detect_format(split) == "chatgpt"
    assert [len(c.turns) for c in chatgpt.parse(split)] == [6, 2]


def _with(tmp_path: Path, mutate) -> Path:
    data = json.loads(EXPORT.read_text(encoding="utf-8"))
    mutate(data)
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d[0].update(current_node="nope"), "'current_node' names node 'nope'"),
        (lambda d: d[0].update(current_node=None), "'current_node' is null"),
        (lambda d: d[0]["mapping"]["u-1"].update(parent="a-3"), "the parent links loop"),
        (lambda d: d[1]["mapping"]["b-a"].update(parent="ghost"), "a parent link names node"),
        (
            lambda d: d[0]["mapping"]["a-1"]["message"].update(create_time="yesterday"),
            "timestamp is a string",
        ),
        (lambda d: d[0]["mapping"]["a-1"]["message"].update(create_time=1e300), "out of range"),
        (
            lambda d: d[0]["mapping"]["a-1"]["message"]["content"].update(parts=[3]),
            "content part 0 is a number",
        ),
        (lambda d: d.__setitem__(1, "oops"), "the conversation is a string"),
    ],
)
def test_malformed_content_is_reported_with_location(tmp_path: Path, mutate, expected) -> None:
    path = _with(tmp_path, mutate)
    with pytest.raises(MalformedExportError) as info:
        list(parse_file(path))
    assert expected in str(info.value)
    assert str(path) in str(info.value)
    assert "conversation at index" in info.value.location


def test_truncated_export_reports_index(tmp_path: Path) -> None:
    raw = EXPORT.read_bytes()
    path = tmp_path / "conversations.json"
    path.write_bytes(raw[: len(raw) - 300])  # cut inside the second conversation
    conversations = parse_file(path)
    assert next(conversations).title == "Trip planning: Lisbon"  # the first one still streams
    with pytest.raises(MalformedExportError, match="truncated") as info:
        next(conversations)
    assert info.value.location == "conversation at index 1"


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(b"\xef\xbb\xbf" + EXPORT.read_bytes())
    assert [len(c.turns) for c in parse_file(path)] == [6, 2]


def test_trailing_garbage_after_the_array(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(EXPORT.read_bytes() + b"\n{}")
    with pytest.raises(MalformedExportError, match="trailing garbage") as info:
        list(parse_file(path))
    assert info.value.location == "after the end of the top-level array"
