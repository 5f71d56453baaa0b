"""Claude export: conversations.json and its JSON Lines variant."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from inferscale_core.importers import MalformedExportError, claude, detect_format, parse_file

from ._helpers import FIXTURES

ARRAY = FIXTURES / "claude" / "conversations.json"
LINES = FIXTURES / "claude" / "claude_export.jsonl"

EXPECTED = [
    (
        "Sourdough starter help",
        "0b1c7c9e-3f1a-4d7e-9d51-6a2f1e0c0001",
        [
            (
                "user",
                "My sourdough starter smells like acetone. Is it dead?",
                datetime(2024, 6, 2, 9, 15, 3, 114512, tzinfo=UTC),
                "m-0001",
            ),
            (
                "assistant",
                # content text blocks win over `text`; thinking/tool blocks are dropped
                "Not dead, just hungry: acetone means it ran out of food.\n\n"
                "Feed it 1:1:1 twice a day for a few days.",
                datetime(2024, 6, 2, 9, 15, 11, 900001, tzinfo=UTC),
                "m-0002",
            ),
            # m-0003 (empty text, attachment only) is skipped
            (
                "user",
                "Thanks! I'll feed it tonight.",
                datetime(2024, 6, 2, 11, 20, 41, tzinfo=timezone(timedelta(hours=2))),
                "m-0004",
            ),
        ],
    ),
    (
        "Untitled conversation",
        "0b1c7c9e-3f1a-4d7e-9d51-6a2f1e0c0002",
        [
            (
                "user",
                "Translate 'good morning' to Portuguese.",
                datetime(2024, 6, 3, 18, tzinfo=UTC),
                "m-0101",
            ),
            ("assistant", "Bom dia.", datetime(2024, 6, 3, 18, 0, 5, tzinfo=UTC), "m-0102"),
        ],
    ),
]


def _flatten(path: Path) -> list[tuple[str, str | None, list[tuple]]]:
    return [
        (
            c.title,
            c.source_id,
            [(t.speaker, t.text, t.timestamp, t.source_id) for t in c.turns],
        )
        for c in parse_file(path)
    ]


@pytest.mark.parametrize("path", [ARRAY, LINES], ids=["array", "jsonl"])
def test_exact_turns(path: Path) -> None:
    assert detect_format(path) == "claude"
    assert _flatten(path) == EXPECTED
    assert {c.source for c in parse_file(path)} == {"claude"}


def test_jsonl_variant_detected_when_renamed(tmp_path: Path) -> None:
    renamed = tmp_path / "export.txt"
    renamed.write_bytes(LINES.read_bytes())
    assert detect_format(renamed) == "claude"


def test_message_without_sender_is_malformed(tmp_path: Path) -> None:
    data = json.loads(ARRAY.read_text(encoding="utf-8"))
    del data[1]["chat_messages"][1]["sender"]
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(MalformedExportError, match="'sender' is missing") as info:
        list(claude.parse(path))
    assert info.value.location.startswith("conversation at index 1")
    assert info.value.location.endswith("message 1")


def test_bad_line_in_jsonl_variant_names_the_line(tmp_path: Path) -> None:
    lines = LINES.read_text(encoding="utf-8").splitlines()
    path = tmp_path / "claude.jsonl"
    path.write_text(lines[0] + "\n\n" + lines[1][:-5] + "\n", encoding="utf-8")
    with pytest.raises(MalformedExportError, match="invalid JSON") as info:
        list(parse_file(path))
    assert info.value.location == "line 3"


ATTACHMENTS = FIXTURES / "claude" / "attachments.json"


def test_attachment_text_comes_with_its_turn() -> None:
    assert detect_format(ATTACHMENTS) == "claude"
    (conv,) = parse_file(ATTACHMENTS)
    assert [(t.speaker, t.source_id, t.text) for t in conv.turns] == [
        (
            "user",
            "a-0001",
            "Can my landlord raise the rent this much?\n\n"
            "[attachment: renewal_notice.txt]\n"
            "Dear tenant,\n"
            "From 1 November 2024 the monthly rent for flat 3B rises from 950 EUR to 1,140 EUR.",
            # flat.jpg: no extracted text, nothing added
        ),
        (
            "assistant",
            "a-0002",
            "That is a 20% rise; check the cap in your lease and your city's rules.",
        ),
        # no message text, only an attachment: the attachment is the turn
        (
            "user",
            "a-0003",
            "[attachment: lease_2022.md]\nClause 7: the rent may rise by at most 5% a year.",
        ),
    ]


def test_attachments_in_the_jsonl_variant_and_without_a_name(tmp_path: Path) -> None:
    (conv,) = json.loads(ATTACHMENTS.read_text(encoding="utf-8"))
    del conv["chat_messages"][2]["attachments"][0]["file_name"]
    path = tmp_path / "claude.jsonl"
    path.write_text(json.dumps(conv) + "\n", encoding="utf-8")
    (parsed,) = parse_file(path)
    assert parsed.turns[2].text.startswith("[attachment: unnamed]\nClause 7")


def test_an_attachment_that_is_not_an_object_is_malformed(tmp_path: Path) -> None:
    (conv,) = json.loads(ATTACHMENTS.read_text(encoding="utf-8"))
    conv["chat_messages"][0]["attachments"][1] = "flat.jpg"
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps([conv]), encoding="utf-8")
    with pytest.raises(MalformedExportError, match="attachment 1 is a string") as info:
        list(parse_file(path))
    assert info.value.location.endswith("message 0")
