"""WhatsApp _chat.txt exports: iOS and Android, multi-line, media, day/month order."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from inferscale_core.importers import MalformedExportError, detect_format, parse_file, whatsapp

from ._helpers import FIXTURES

WA = FIXTURES / "whatsapp"


def _turns(path: Path) -> list[tuple[str, str, datetime | None]]:
    (conv,) = parse_file(path)
    return [(t.speaker, t.text, t.timestamp) for t in conv.turns]


def test_ios_month_first_with_marks_media_and_multiline() -> None:
    path = WA / "WhatsApp Chat - Alice Smith" / "_chat.txt"
    assert detect_format(path) == "whatsapp"
    (conv,) = parse_file(path)
    assert (conv.title, conv.source, conv.source_id) == ("Alice Smith", "whatsapp", None)
    assert [(t.speaker, t.text, t.timestamp, t.source_id) for t in conv.turns] == [
        # line 1, the encryption notice (U+200E-marked), is skipped
        ("Alice Smith", "Are we still on for brunch tomorrow?", datetime(2023, 12, 30, 21, 41, 5),
         "line:2"),
        ("Bob", 'Yes! 11:00 at the usual place.\nBring the book you borrowed: "Dune"\n'
         "and the charger.", datetime(2023, 12, 30, 21, 42, 17), "line:3"),
        ("Alice Smith", "[media omitted]", datetime(2023, 12, 30, 21, 43, 1), "line:6"),
        ("Bob", "[media omitted]", datetime(2023, 12, 30, 21, 43, 30), "line:7"),
        # line 8 ("This message was deleted") is skipped; the edit marker is removed
        ("Alice Smith", "Running 10 min late sorry", datetime(2023, 12, 31, 8, 3, 10), "line:9"),
        ("Bob", "Happy new year's eve 🎉", datetime(2023, 12, 31, 12, 15), "line:10"),
        # line 11 ("Missed voice call") is skipped
    ]  # fmt: skip
    assert all(t.timestamp.tzinfo is None for t in conv.turns)  # local phone time: naive


def test_android_day_first_24h_system_lines_and_crlf() -> None:
    path = WA / "WhatsApp Chat with Familia.txt"
    assert detect_format(path) == "whatsapp"
    (conv,) = parse_file(path)
    assert conv.title == "Familia"
    assert [(t.speaker, t.text, t.timestamp) for t in conv.turns] == [
        ("Mãe", "Feliz ano novo a todos!", datetime(2023, 12, 31, 21, 45)),
        ("João", "[media omitted]", datetime(2023, 12, 31, 21, 46)),
        (
            "João",
            "Fotos da festa:\n- a mesa\n- o fogo de artifício",
            datetime(2023, 12, 31, 21, 47),
        ),
        ("+351 912 345 678", "Bom ano!", datetime(2024, 1, 1, 0, 5)),
        ("João", "Alguém viu o meu casaco?", datetime(2024, 1, 2, 10, 0)),
    ]


def test_android_us_12_hour_media_caption() -> None:
    assert _turns(WA / "android_us.txt") == [
        ("Sam", "Did you get home ok?", datetime(2023, 12, 31, 21, 41)),
        ("Priya", "yes!\nthanks for driving", datetime(2023, 12, 31, 23, 58)),
        # 12:03 AM is just after midnight; the caption follows the placeholder
        ("Sam", "[media omitted]\nfireworks from the roof", datetime(2024, 1, 1, 0, 3)),
    ]


@pytest.mark.parametrize(
    ("name", "dates"),
    [
        # all fields <= 12, one day: 12-hour clock + 2-digit year → month first (US)
        ("ambiguous_ios_12h_default.txt", [datetime(2024, 3, 4, 9), datetime(2024, 3, 4, 9, 5)]),
        # same, 24-hour clock + 4-digit year → day first
        (
            "ambiguous_android_24h_default.txt",
            [datetime(2024, 4, 3, 9), datetime(2024, 4, 3, 9, 5)],
        ),
        # only day-first keeps the dates in order (beats the 12-hour default)
        (
            "ambiguous_chronological_dayfirst.txt",
            [datetime(2024, 1, 5, 10), datetime(2024, 1, 6, 10), datetime(2024, 2, 2, 10)],
        ),
        # only month-first keeps the dates in order (beats the 24-hour default)
        (
            "ambiguous_chronological_monthfirst.txt",
            [datetime(2024, 1, 5, 10), datetime(2024, 1, 6, 10), datetime(2024, 2, 2, 10)],
        ),
    ],
)
def test_day_month_order_rule(name: str, dates: list[datetime]) -> None:
    assert [stamp for _, _, stamp in _turns(WA / name)] == dates


def test_same_dates_in_both_orders(tmp_path: Path) -> None:
    day_first = tmp_path / "a.txt"
    day_first.write_text("13/02/2024, 08:00 - Ana: hi\n01/02/2024, 09:00 - Ben: yo\n")
    month_first = tmp_path / "b.txt"
    month_first.write_text("02/13/2024, 08:00 - Ana: hi\n02/01/2024, 09:00 - Ben: yo\n")
    assert [s for _, _, s in _turns(day_first)] == [
        datetime(2024, 2, 13, 8),
        datetime(2024, 2, 1, 9),
    ]
    assert [s for _, _, s in _turns(month_first)] == [
        datetime(2024, 2, 13, 8),
        datetime(2024, 2, 1, 9),
    ]


def test_year_first_dates(tmp_path: Path) -> None:
    path = tmp_path / "chat.txt"
    path.write_text("[2024-02-13 08:00:00] Ana: hallo\n")
    assert _turns(path) == [("Ana", "hallo", datetime(2024, 2, 13, 8))]


def test_title_from_participants_for_bare_chat_txt(tmp_path: Path) -> None:
    path = tmp_path / "_chat.txt"
    path.write_text(
        "[1/2/24, 9:00:00 AM] ~\u202fZoe: hi\n[1/2/24, 9:01:00 AM] Yan: hey\n[1/2/24, 9:02:00 AM]"
        " Zoe: \u200eaudio omitted\n",
        encoding="utf-8",
    )
    (conv,) = parse_file(path)
    assert conv.title == "Zoe & Yan"
    assert [t.text for t in conv.turns] == ["hi", "hey", "[media omitted]"]


def test_conflicting_dates_are_malformed(tmp_path: Path) -> None:
    path = tmp_path / "chat.txt"
    path.write_text("13/01/2024, 08:00 - Ana: hi\n01/13/2024, 09:00 - Ben: yo\n")
    with pytest.raises(MalformedExportError, match="neither all day/month") as info:
        list(parse_file(path))
    assert info.value.location == "lines 1 and 2"


def test_impossible_date_names_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.txt"
    path.write_text("31/01/2024, 08:00 - Ana: hi\n31/02/2024, 09:00 - Ben: yo\n")
    with pytest.raises(MalformedExportError, match="reading the date as day/month") as info:
        list(parse_file(path))
    assert info.value.location == "line 2"


def test_invalid_utf8_names_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.txt"
    path.write_bytes(b"31/01/2024, 08:00 - Ana: hi\n31/01/2024, 08:01 - Ben: \xff\xfe\n")
    with pytest.raises(MalformedExportError, match="not valid UTF-8") as info:
        list(parse_file(path))
    assert info.value.location == "line 2"


@pytest.mark.parametrize(
    "line",
    [
        "[12/31/23, 9:41:05\u202fPM] Name: text",
        "\u200e[12/31/23, 9:41:05 PM] Name: text",
        "[31.12.23, 21:41:05] Name: text",
        "31/12/2023, 21:41 - Name: text",
        "12/31/23, 9:41 PM - Name: text",
        "12/31/23, 9:41 p.m. - Name: text",
    ],
)
def test_header_patterns(line: str) -> None:
    assert whatsapp.parse_header(line) is not None


@pytest.mark.parametrize("line", ["Name: text", "12/31/23 Name: text", "[12/31/23] x", ""])
def test_not_headers(line: str) -> None:
    assert whatsapp.parse_header(line) is None
