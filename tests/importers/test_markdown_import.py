"""Markdown / plain transcripts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from inferscale_core.importers import detect_format, parse_file

from ._helpers import FIXTURES


def test_markdown_transcript_exactly() -> None:
    path = FIXTURES / "markdown" / "transcript.md"
    assert detect_format(path) == "markdown"
    (conv,) = parse_file(path)
    assert (conv.title, conv.source) == ("Garden planning with Claude", "markdown")
    day = datetime(2024, 4, 20)
    evening = datetime(2024, 4, 21, 18, 5, tzinfo=timezone(timedelta(hours=1)))
    assert [(t.speaker, t.text, t.timestamp, t.source_id) for t in conv.turns] == [
        ("user", "When should I plant tomatoes in Porto?\nI have a south-facing balcony.", day,
         "line:12"),
        ("assistant", "After the last frost, usually mid-April. On a south-facing balcony:\n\n"
         "- use pots of at least 20 litres\n- water in the morning\n\n```text\n"
         "Note: this line is inside a code fence and is not a speaker.\n```", day, "line:15"),
        ("Maya", "I planted three San Marzano seedlings today.", evening, "line:24"),
        # the heading turn; the horizontal rule after it is dropped
        ("assistant", "Great choice. Pinch out the side shoots once a week.", evening, "line:26"),
        ("Leo", "Do they need a cage?", evening, "line:32"),
        ("assistant", "A stake is enough for San Marzano.", evening, "line:33"),
    ]  # fmt: skip


def test_plain_text_transcript() -> None:
    path = FIXTURES / "markdown" / "notes.txt"
    assert detect_format(path) == "markdown"
    (conv,) = parse_file(path)
    assert conv.title == "notes"
    assert [(t.speaker, t.text, t.timestamp) for t in conv.turns] == [
        ("Alice", "did you book the table?", None),
        ("Bob", "yes, 8pm at Taberna.", None),
        ("Alice", "perfect\nsee you there", None),
    ]


def test_title_heading_and_bold_variants(tmp_path: Path) -> None:
    path = tmp_path / "t.md"
    path.write_text(
        "# Call with Sam\n\n**Sam**: see https://example.com at 10:30\n"
        "[2024-05-01 09:30] **Me:** ok\n",
        encoding="utf-8",
    )
    (conv,) = parse_file(path)
    assert conv.title == "Call with Sam"
    assert [(t.speaker, t.text, t.timestamp) for t in conv.turns] == [
        ("Sam", "see https://example.com at 10:30", None),
        ("Me", "ok", datetime(2024, 5, 1, 9, 30)),
    ]
