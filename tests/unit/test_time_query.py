"""The time a question names, read against the day it is asked."""

from __future__ import annotations

from datetime import date

import pytest

from inferscale_core.time_query import (
    asks_about_past,
    asks_about_present,
    question_interval,
    states_past,
)

TODAY = date(2025, 12, 20)  # a Saturday


@pytest.mark.parametrize(
    ("question", "start", "end"),
    [
        ("What did I do in September 2024?", date(2024, 9, 1), date(2024, 10, 1)),
        ("What happened last March?", date(2025, 3, 1), date(2025, 4, 1)),
        ("What did I do in May?", date(2025, 5, 1), date(2025, 6, 1)),
        ("Anything in december?", date(2025, 12, 1), date(2026, 1, 1)),
        ("Where did I live in 2023?", date(2023, 1, 1), date(2024, 1, 1)),
        ("What did I do in spring 2024?", date(2024, 3, 1), date(2024, 6, 1)),
        ("Where did I spend my summer holiday in 2024?", date(2024, 6, 1), date(2024, 9, 1)),
        ("Any trips last winter?", date(2024, 12, 1), date(2025, 3, 1)),
        ("What are my plans for next summer?", date(2026, 6, 1), date(2026, 9, 1)),
        ("What did I do this autumn?", date(2025, 9, 1), date(2025, 12, 1)),
        ("What did I do last weekend?", date(2025, 12, 13), date(2025, 12, 15)),
        ("What did I do last week?", date(2025, 12, 8), date(2025, 12, 15)),
        ("What did I do last month?", date(2025, 11, 1), date(2025, 12, 1)),
        ("What happened last year?", date(2024, 1, 1), date(2025, 1, 1)),
        ("What did I do yesterday?", date(2025, 12, 19), date(2025, 12, 20)),
        ("What happened on 12 March?", date(2025, 3, 12), date(2025, 3, 13)),
        ("What did I eat on March 3rd, 2024?", date(2024, 3, 3), date(2024, 3, 4)),
        ("Who did I see in Jun?", date(2025, 6, 1), date(2025, 7, 1)),  # after "in": a month
        ("Who came to the party at the end of April?", date(2025, 4, 1), date(2025, 5, 1)),
        # a part of a year, as the life sets' writers bound it
        ("What car did I have at the start of 2024?", date(2024, 1, 1), date(2024, 4, 1)),
        ("Who was I dating in the first half of 2024?", date(2024, 1, 1), date(2024, 7, 1)),
        ("What was I taking at the end of 2024?", date(2024, 10, 1), date(2025, 1, 1)),
        ("Where was I in mid-2023?", date(2023, 5, 1), date(2023, 9, 1)),
        ("What did I do early last year?", date(2024, 1, 1), date(2024, 4, 1)),
        ("Any trips in Q3 2024?", date(2024, 7, 1), date(2024, 10, 1)),
        ("June was busy, what did I do?", date(2025, 6, 1), date(2025, 7, 1)),
    ],
)
def test_named_days(question, start, end):
    assert question_interval(question, TODAY) == (start, end)


@pytest.mark.parametrize(
    "question",
    [
        "Where do I live now?",
        "May I ask where I work?",
        "How much is 2000 euros?",
        "My job?",
        "Where does Jun Mesel keep the folding camera?",  # a name, not June
        "What does April Ludgate do?",
        "Where does Jan work?",
    ],
)
def test_no_time(question):
    assert question_interval(question, TODAY) is None
    assert not asks_about_past(question, TODAY)


@pytest.mark.parametrize(
    "question",
    [
        "Where did I live in 2023?",
        "What was my old job?",
        "What car did I drive before the Tesla?",
        "Where did I work previously?",
    ],
)
def test_the_past(question):
    assert asks_about_past(question, TODAY)


def test_this_month_is_not_the_past():
    assert question_interval("What's planned this month?", TODAY) == (
        date(2025, 12, 1),
        date(2026, 1, 1),
    )
    assert not asks_about_past("What's planned this month?", TODAY)


@pytest.mark.parametrize(
    ("question", "present"),
    [
        ("Where do I live now?", True),
        ("Am I still at Siemens?", True),
        ("What mobile have I got?", True),  # "have got" is having, now
        ("What have I got on the go reading-wise?", True),
        ("Which races have I done?", False),  # the present perfect looks back
        ("What car did I get in 2023?", False),
        ("What did I get for my birthday?", False),
        ("Where does the sun rise?", False),  # nobody's own present
        ("Where's home these days?", True),  # "now", no one named: the asker's
        ("what's the job situation at the moment", True),
        ("Where is Alex from work based now?", False),  # Alex's present, not the asker's
        ("Where does the sun rise these days?", True),  # read as the asker's: harmless
        # ways of asking the 517 facet questions of two helpers (45d9008) had that were not
        # read as the present: a request, a modal, no apostrophe, "rn", a question word as
        # the subject of a present verb
        ("remind me what scooter I ride", True),
        ("What can't I have with my tablets?", True),
        ("whats my bike", True),
        ("whos my landlord rn", True),
        ("Who approves my holidays?", True),
        ("which gym takes my membership fee", True),
        ("How much lands in my account each month?", True),
        ("remind me what I did last summer", False),  # a time named, and gone
        ("Who signed off my leave?", False),
        ("Which races has Alex run?", False),
    ],
)
def test_the_present(question, present):
    assert asks_about_present(question, TODAY) is present


@pytest.mark.parametrize(
    ("text", "past"),
    [
        ("My old job was at the post office in Lisbon.", True),
        ("I used to live in Leeds.", True),
        ("Our old flat had no lift.", True),
        ("My ex-boss rang me today.", True),
        ("Back when I was a nurse I worked nights.", True),
        ("I moved from Lisbon to Porto last month.", False),
        ("My oldest friend is getting married.", False),
        ("My old friend Sam visited.", False),
        ("My old man turns seventy in May.", False),
        ("My exam is on Friday.", False),
        # the old one named beside what holds now
        ("My old dentist is too far now, so I found one in town.", False),
        ("New dentist yesterday; she liked the crown my old dentist did.", False),
        ("I used to cycle, I take the bus instead.", False),
    ],
)
def test_a_fact_that_tells_of_the_past(text, past):
    assert states_past(text) is past
