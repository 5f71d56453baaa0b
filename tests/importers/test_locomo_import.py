"""LoCoMo: one conversation per session, on a tiny sample and on our LoCoMo-format fixture."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from inferscale_core.importers import detect_format, locomo, parse_file
from tests.support import LOCOMO_FIXTURE

from ._helpers import FIXTURES


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


def test_fixture_every_session_date_turn_and_photo() -> None:
    assert detect_format(LOCOMO_FIXTURE) == "locomo"
    convs = list(parse_file(LOCOMO_FIXTURE))
    # fx-2's session_4 has a date but no turn list: it is not a session
    assert [(c.title, c.source_id, c.source, len(c.turns)) for c in convs] == [
        ("Nadia & Tomas — session 1", "fx-1/session_1", "locomo", 10),
        ("Nadia & Tomas — session 2", "fx-1/session_2", "locomo", 12),
        ("Nadia & Tomas — session 3", "fx-1/session_3", "locomo", 11),
        ("Nadia & Tomas — session 4", "fx-1/session_4", "locomo", 12),
        ("Priya & Leo — session 1", "fx-2/session_1", "locomo", 9),
        ("Priya & Leo — session 2", "fx-2/session_2", "locomo", 11),
        ("Priya & Leo — session 3", "fx-2/session_3", "locomo", 13),
    ]
    starts = [
        datetime(2023, 3, 3, 10, 15),  # "10:15 am on 3 March, 2023"
        datetime(2023, 3, 19, 18, 40),
        datetime(2023, 5, 2, 20, 5),
        datetime(2023, 6, 25, 16, 30),
        datetime(2023, 8, 14, 9, 20),  # "9:20 am on 14 August, 2023"
        datetime(2023, 9, 2, 19, 45),
        datetime(2023, 10, 22, 13, 10),
    ]
    for conv, start in zip(convs, starts, strict=True):
        session = conv.source_id.rsplit("_", 1)[1]
        assert [t.source_id for t in conv.turns] == [
            f"D{session}:{i}" for i in range(1, len(conv.turns) + 1)
        ]
        assert {t.timestamp for t in conv.turns} == {start}  # the session's date on every turn
    assert (convs[0].turns[0].speaker, convs[0].turns[0].text) == (
        "Nadia",
        "Morning Tomas! How was your weekend?",
    )
    assert {t.speaker for c in convs[:4] for t in c.turns} == {"Nadia", "Tomas"}
    assert {t.speaker for c in convs[4:] for t in c.turns} == {"Priya", "Leo"}

    photos = {
        (c.source_id, t.source_id): t.text
        for c in convs
        for t in c.turns
        if "[shares a photo:" in t.text
    }
    assert set(photos) == {
        ("fx-1/session_1", "D1:7"),
        ("fx-1/session_2", "D2:3"),
        ("fx-1/session_4", "D4:3"),
        ("fx-2/session_1", "D1:4"),
        ("fx-2/session_3", "D3:4"),
    }
    assert photos[("fx-2/session_3", "D3:4")] == (
        "My medal, still warm from the sun. [shares a photo: a photo of a finisher medal on a"
        " blue ribbon]"
    )

    # every turn of the file, in order, with its text (and caption) unchanged
    raw = json.loads(LOCOMO_FIXTURE.read_text())
    expected = [
        (turn["speaker"], turn["dia_id"], turn["text"], turn.get("blip_caption"))
        for sample in raw
        for key, turns in sample["conversation"].items()
        if isinstance(turns, list)
        for turn in turns
    ]
    got = [(t.speaker, t.source_id, t.text) for c in convs for t in c.turns]
    assert len(got) == len(expected) == 78
    for (speaker, dia_id, text), (speaker_in, dia_id_in, text_in, caption) in zip(
        got, expected, strict=True
    ):
        assert (speaker, dia_id) == (speaker_in, dia_id_in)
        assert text == (f"{text_in} [shares a photo: {caption}]" if caption else text_in)
