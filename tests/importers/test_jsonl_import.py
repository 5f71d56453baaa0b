"""Generic JSON Lines chat logs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from inferscale_core.importers import MalformedExportError, detect_format, parse_file

from ._helpers import FIXTURES


def test_single_conversation_with_mixed_timestamps() -> None:
    path = FIXTURES / "jsonl" / "chat.jsonl"
    assert detect_format(path) == "jsonl"
    (conv,) = parse_file(path)
    assert (conv.title, conv.source, conv.source_id) == ("chat", "jsonl", None)
    assert [(t.speaker, t.text, t.timestamp, t.source_id) for t in conv.turns] == [
        (
            "user",
            "Remind me what my dentist's name is.",
            datetime(2024, 2, 10, 8, 30, tzinfo=UTC),
            "line:1",
        ),
        (
            "assistant",
            "You told me it's Dr. Okafor, at the clinic on Rua Augusta.",
            datetime(2024, 2, 10, 8, 30, 5, tzinfo=UTC),  # epoch seconds → UTC
            "line:2",
        ),
        # list-of-blocks content; an ISO string without offset stays naive
        ("user", "And when is my appointment?", datetime(2024, 2, 10, 8, 31, 10), "line:4"),
        # line 5 (null content) is skipped
        (
            "assistant",
            "Thursday at 3 pm.",
            datetime(2024, 2, 10, 8, 31, 12, 500000, tzinfo=UTC),
            "msg-4",
        ),
    ]


def test_grouped_by_conversation_id_in_order() -> None:
    convs = list(parse_file(FIXTURES / "jsonl" / "grouped.jsonl"))
    assert [(c.title, c.source_id) for c in convs] == [
        ("Trip ideas", "trip"),
        ("Leo's birthday", "gift"),  # the first title seen for the group, even on a later line
    ]
    trip, gift = convs
    assert [(t.speaker, t.text, t.timestamp) for t in trip.turns] == [
        ("Maya", "Let's go hiking in the Azores.", datetime(2024, 6, 1, 9, tzinfo=UTC)),  # ms
        ("Leo", "Yes! São Miguel in September.", datetime(2024, 6, 1, 9, 1, tzinfo=UTC)),
    ]
    assert [(t.speaker, t.text, t.timestamp) for t in gift.turns] == [
        ("Maya", "Gift for Leo: a film camera?", None),
        ("Tom", "He'd love that.", None),
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"role": "user"}\n{"content": "x"}\n', "(line 2): no 'role' or 'speaker'"),
        ('{"role": "user", "content": "x"}\n[1, 2]\n', "(line 2): the line is an array"),
        ('{"role": "user", "content": {"a": 1}}\n', "(line 1): the content is an object"),
        ('{"role": "user", "content": "x", "timestamp": "soon"}\n', "is not ISO 8601"),
        ('{"role": "user", "content": "x", "timestamp": true}\n', "timestamp is a boolean"),
        ('{"role": "user", "content": "x"}\n{"role": "user", "content": "y"\n', "line 2"),
    ],
)
def test_malformed_lines(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(MalformedExportError) as info:
        list(parse_file(path, fmt="jsonl"))
    assert expected in str(info.value)
