"""LoCoMo: one conversation per session; the real file's totals."""

from __future__ import annotations

from datetime import datetime

import pytest

from inferscale_core.importers import detect_format, locomo, parse_file

from ._helpers import FIXTURES, LOCOMO_REAL


def test_mini_sample_exactly() -> None:
    path = FIXTURES / "locomo" / "locomo_mini.json"
    assert detect_format(path) == "locomo"
    convs = list(parse_file(path))
    # session_3 has a date but no turn list: it is not a session
    assert [(c.title, c.source_id, c.source) for c in convs] == [
        ("Ana & Ben — session 1", "mini-1/session_1", "locomo"),
        ("Ana & Ben — session 2", "mini-1/session_2", "locomo"),
    ]
    first = datetime(2023, 5, 8, 13, 56)
    assert [(t.speaker, t.text, t.timestamp, t.source_id) for t in convs[0].turns] == [
        ("Ana", "Hey Ben! Long time no see.", first, "D1:1"),
        ("Ben", "Ana! I adopted a cat yesterday. [shares a photo: a photo of a grey cat on a sofa]",
         first, "D1:2"),
        ("Ana", "So cute! What's her name?", first, "D1:3"),
    ]  # fmt: skip
    assert [t.timestamp for t in convs[1].turns] == [datetime(2023, 6, 12, 10, 4)] * 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9)),
        ("12:30 pm on 1 January, 2024", datetime(2024, 1, 1, 12, 30)),
        ("10:04 AM on 12 Jun 2023", datetime(2023, 6, 12, 10, 4)),
    ],
)
def test_date_time_strings(text: str, expected: datetime) -> None:
    assert locomo.parse_date_time(text) == expected


@pytest.mark.parametrize(
    "text",
    ["yesterday", "13:00 pm on 1 May, 2023", "1:00 pm on 30 Feb, 2023", "1:00 pm on 3 Ma, 2023"],
)
def test_bad_date_time_strings(text: str) -> None:
    with pytest.raises(ValueError):
        locomo.parse_date_time(text)


def test_real_locomo10_totals() -> None:
    if not LOCOMO_REAL.is_file():
        pytest.skip(f"the LoCoMo file is not present at {LOCOMO_REAL.resolve()}")
    assert detect_format(LOCOMO_REAL) == "locomo"
    sessions = list(parse_file(LOCOMO_REAL))
    samples = {c.source_id.split("/")[0] for c in sessions}
    assert len(samples) == 10
    assert len(sessions) == 272
    assert sum(len(c.turns) for c in sessions) == 5882
    assert all(t.timestamp is not None and t.text for c in sessions for t in c.turns)
    assert sessions[0].title == "Caroline & Melanie — session 1"
    assert sessions[0].turns[0].source_id == "D1:1"
    per_sample = {}
    for c in sessions:
        per_sample.setdefault(c.source_id.split("/")[0], []).append(c)
    assert len(per_sample["conv-26"]) == 19  # more date keys (35) than session lists (19)
    assert sum(len(c.turns) for c in per_sample["conv-41"]) == 663
