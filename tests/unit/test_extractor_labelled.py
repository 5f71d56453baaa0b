"""The deterministic extractor measured on small labelled lists (issue 36, "Better facts" and
"Dates that mean something").

Written by hand for this, never tuned on a conversation the benchmarks use. The scores are the
share of turns the extractor gets right; ``python -m tests.unit.test_extractor_labelled``
prints them.
"""

from __future__ import annotations

from datetime import date, datetime

from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.types import Turn

# Wednesday 16 October 2024, evening: the day every dated turn below was said.
SAID = datetime(2024, 10, 16, 18, 30)

# (speaker, text, is a fact)
FACT_TURNS: list[tuple[str, str, bool]] = [
    ("user", "I moved to Porto in March.", True),
    ("user", "My dog Miso is grey.", True),
    ("user", "I work as a nurse now.", True),
    ("user", "So much for the diet, I ate two pizzas last night.", True),
    ("user", "My sister Ines lives in Lisbon with her two kids.", True),
    ("user", "I'm allergic to peanuts.", True),
    ("user", "We adopted a second cat called Tofu.", True),
    ("user", "I started learning the cello this week.", True),
    ("user", "Well, I finally quit my job at the bank.", True),
    ("user", "My husband's birthday is on 2 June.", True),
    ("user", "I ran my first half marathon in 1:58.", True),
    ("user", "Our flat has a balcony facing the river.", True),
    ("user", "I don't eat meat anymore.", True),
    ("user", "My favourite book is Dune.", True),
    ("Caroline", "I went to an LGBTQ support group today.", True),
    ("user", "I'm learning Portuguese with a tutor on Tuesdays.", True),
    ("user", "Honestly, I hate commuting by bus.", True),
    ("user", "I have two kids, Leo and Mara.", True),
    ("user", "My mom was diagnosed with diabetes last year.", True),
    ("user", "Thanks, I finally got the visa approved yesterday.", True),
    ("user", "Tell me a joke about translators.", False),
    ("user", "That helps a bit.", False),
    ("user", "Can you summarize this?", False),
    ("user", "Thanks!", False),
    ("user", "ok", False),
    ("user", "What's the weather like?", False),
    ("user", "Could you translate this into French please", False),
    ("user", "Please write a short poem about autumn.", False),
    ("user", "That sounds good to me.", False),
    ("user", "Sounds great, thanks a lot!", False),
    ("user", "Give me three ideas for dinner.", False),
    ("user", "Explain how a heat pump works.", False),
    ("user", "Haha that's so funny lol", False),
    ("user", "Got it, that makes sense.", False),
    ("user", "Let's try another one.", False),
    ("user", "Okay, thank you so much for the help!", False),
    ("user", "Do you know any good podcasts about history", False),
    ("user", "Another joke please, about cats this time.", False),
    ("user", "Remind me to call the plumber on Friday.", False),
    ("user", "I'd like you to rewrite the intro.", False),
]

# (text, the day it refers to), all said on SAID
DATED_TURNS: list[tuple[str, date]] = [
    # named dates
    ("I moved to Porto on 12 March.", date(2024, 3, 12)),
    ("My surgery was postponed to 9 April next year.", date(2025, 4, 9)),
    ("The dentist appointment got postponed to 4 November.", date(2024, 11, 4)),
    ("I turned 30 on March 3rd.", date(2024, 3, 3)),
    ("We got the keys on 2 September 2023.", date(2023, 9, 2)),
    ("I quit smoking on 2024-02-11.", date(2024, 2, 11)),
    ("Our wedding anniversary was on the 5th of October.", date(2024, 10, 5)),
    ("I'll fly to Boston on 28 October.", date(2024, 10, 28)),
    # weekdays
    ("I saw Ana last Saturday.", date(2024, 10, 12)),
    ("I met my new manager on Friday.", date(2024, 10, 11)),
    ("Last Sunday I baked sourdough for the first time.", date(2024, 10, 13)),
    ("On Monday I started the new job.", date(2024, 10, 14)),
    ("I have a job interview on Friday.", date(2024, 10, 18)),
    ("I'm going to see the cardiologist next Tuesday.", date(2024, 10, 22)),
    # weekends
    ("We went hiking in Sintra last weekend.", date(2024, 10, 12)),
    ("Last weekend my brother visited us.", date(2024, 10, 12)),
    ("We're painting the kitchen this weekend.", date(2024, 10, 19)),
    # months
    ("I started the job in September 2024.", date(2024, 9, 1)),
    ("We moved to Lisbon in March.", date(2024, 3, 1)),
    ("My grandmother passed away in January 2023.", date(2023, 1, 1)),
    ("In July we adopted a puppy.", date(2024, 7, 1)),
    ("I got married in May 2019.", date(2019, 5, 1)),
    ("I will start a pottery course in December.", date(2024, 12, 1)),
    ("I got married in 2019.", date(2019, 1, 1)),
    # ranges: the start
    ("I was in Rome from 3 to 5 May.", date(2024, 5, 3)),
    ("We stayed in Kyoto 12-16 April.", date(2024, 4, 12)),
    ("I was ill between 2 and 6 September.", date(2024, 9, 2)),
    ("We travelled around Japan from March to May.", date(2024, 3, 1)),
    # the relative dates resolved before
    ("I adopted a cat 3 days ago.", date(2024, 10, 13)),
    ("Yesterday I went to a support group.", date(2024, 10, 15)),
    ("Two weeks ago I started the cello.", date(2024, 10, 2)),
    # numbers that are not dates: the turn's own day
    ("I have 2 cats and 3 dogs.", date(2024, 10, 16)),
    ("My flat costs 900 a month.", date(2024, 10, 16)),
    ("I may go back to university.", date(2024, 10, 16)),
    ("We bought a house for 250,000 euros.", date(2024, 10, 16)),
    ("I ran 10 km in 55 minutes.", date(2024, 10, 16)),
]


def fact_score(extractor: DeterministicExtractor) -> tuple[int, list[str]]:
    """How many FACT_TURNS the extractor labels right, and the ones it gets wrong."""
    wrong = []
    for speaker, text, is_fact in FACT_TURNS:
        if bool(extractor.extract(Turn(speaker, text, SAID))) != is_fact:
            wrong.append(text)
    return len(FACT_TURNS) - len(wrong), wrong


def date_score(extractor: DeterministicExtractor) -> tuple[int, list[str]]:
    """How many DATED_TURNS get their day right, and the wrong ones (with what they got)."""
    wrong = []
    for text, day in DATED_TURNS:
        ops = extractor.extract(Turn("user", text, SAID))
        got = ops[0].refers_to if ops else None
        if got != day:
            wrong.append(f"{text} -> {got} (want {day})")
    return len(DATED_TURNS) - len(wrong), wrong


def test_the_labelled_lists_are_big_enough():
    assert sum(f for _, _, f in FACT_TURNS) == 20 and len(FACT_TURNS) == 40
    assert len(DATED_TURNS) >= 30


def test_facts_are_told_apart_from_requests_and_filler():
    right, wrong = fact_score(DeterministicExtractor())
    assert right >= 38, wrong  # >= 95%


def test_dated_turns_get_their_day():
    right, wrong = date_score(DeterministicExtractor())
    assert right >= 0.9 * len(DATED_TURNS), wrong


if __name__ == "__main__":
    extractor = DeterministicExtractor()
    for name, score in (("facts", fact_score), ("dates", date_score)):
        right, wrong = score(extractor)
        total = right + len(wrong)
        print(f"{name}: {right}/{total} right ({right / total:.0%})")
        for line in wrong:
            print("   wrong:", line)
