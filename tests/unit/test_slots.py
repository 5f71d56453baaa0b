"""The slot patterns on labelled statements: what each sets or ends, and pairs that replace
one another or not (a precision / recall check of the supersession decision)."""

from __future__ import annotations

import pytest

from inferscale_core.slots import ANY, SELF, Slot, slots

SETS = [
    ("I live in Lisbon with my partner.", "residence", "lisbon"),
    ("We finally moved to Porto last weekend.", "residence", "porto"),
    ("Just moved to Berlin!", "residence", "berlin"),
    ("I'm based in New York now.", "residence", "new york"),
    ("Started at Siemens on Monday as a data engineer.", "employer", "siemens"),
    ("Started at Siemens on Monday as a data engineer.", "role", "data engineer"),
    ("I work as a nurse at St John's hospital.", "employer", "st john's"),
    ("I work as a nurse at St John's hospital.", "role", "nurse"),
    ("I started a new job at Google.", "employer", "google"),
    ("My new salary is 4,100 a month.", "salary", "4100"),
    ("I earn 3200 euros now.", "salary", "3200"),
    ("My dog Rex loves the beach.", "dog", "rex"),
    ("We adopted a beagle called Mochi.", "dog", "mochi"),
    ("My cat is called Miso.", "cat", "miso"),
    ("I'm dating Marta.", "partner", "marta"),
    ("My girlfriend Ana and I went hiking.", "partner", "ana"),
    ("I'm vegetarian.", "diet", "vegetarian"),
    ("I went vegan in January.", "diet", "vegan"),
    ("I cycle to work every day.", "commute", "cycle"),
    ("I drive a Toyota Corolla.", "car", "toyota corolla"),
    ("My new phone is a Pixel 8.", "phone", "pixel 8"),
    ("My manager is Paulo.", "manager", "paulo"),
    ("My favourite band is Radiohead.", "favourite band", "radiohead"),
    ("Priya is my manager, she's from Bangalore.", "manager", "priya"),
    ("Lena and I are officially together now.", "partner", "lena"),
    ("So I bought a Pixel 8 yesterday.", "phone", "pixel 8"),
    ("And I bought the Tesla, a grey 2021 Model 3.", "car", "tesla"),
    ("Reading Dune at the moment, slowly.", "book", "dune"),
    ("I'm in the B1 course now.", "course", "b1"),
    ("I'm switching from guitar to piano.", "instrument", "piano"),
    ("We pay 780 a month for the flat.", "rent", "780"),
    ("I take home 2,300 euros a month after tax.", "salary", "2300"),
    ("I cancelled Fitness Hut and got a McFit membership.", "gym", "mcfit"),
    ("I've gone fully vegan since 1 January.", "diet", "vegan"),
    ("I take the green line metro to the office.", "commute", "metro"),
    # a change said without the old value's words
    ("My first day at Bosch was chaos, I started on Monday.", "employer", "bosch"),
    ("Loving my new job at Spotify.", "employer", "spotify"),
    ("Being a nurse is harder than I thought.", "role", "nurse"),
    ("I got promoted to senior engineer!", "role", "senior engineer"),
    ("I'm a data analyst now.", "role", "data analyst"),
    ("Rent is 950 for our flat.", "rent", "950"),
    ("We found a flat in Graça, 900 a month.", "rent", "900"),
]
NONE = [
    "My cousin lives in Porto.",  # someone else's
    "I started learning German.",
    "Can you suggest a recipe?",
    "We went to the beach in Cascais.",
    "My sister is visiting next week.",
    "I lived in Lisbon for five years.",  # past: no state now
    "I started The Three-Body Problem.",  # a book or a job? not told
    "Reading about the history of Lisbon.",
    "I'm learning a lot at the new job.",
    "My first week at the gym was hard.",
    "Being a parent is hard.",  # not a job
    "My sister is a nurse.",
    "I'm a big fan of jazz.",
]
ENDS = [
    ("I don't work at Siemens anymore.", "employer", "siemens"),
    ("Rex died in March.", ANY, "rex"),
    ("We moved out of Lisbon.", "residence", "lisbon"),
    ("Sold the Tesla on Saturday.", "car", "tesla"),
    ("I'm without a car for the first time.", "car", ANY),
    ("I cancelled Fitness Hut and got a McFit membership.", "gym", "fitness hut"),
    ("Sofia and I broke up 2 days ago.", "partner", "sofia"),  # the name, not "2 da"
]
# (older, newer, whether the newer replaces the older)
PAIRS = [
    ("I live in Lisbon.", "We moved to Porto.", True),
    ("I live in Lisbon.", "I moved to Lisbon in 2019.", False),  # the same value, told again
    ("I work at Siemens.", "I started a new job at Bosch.", True),
    ("I work as a nurse.", "I work at the city hospital.", False),  # role vs employer
    ("My dog Rex is 3.", "We adopted a beagle called Mochi.", True),
    ("My salary is 3,000.", "My new salary is 4,100 a month.", True),
    ("I'm vegetarian.", "I went vegan in January.", True),
    ("My favourite band is Radiohead.", "My favourite film is Alien.", False),
    ("Caroline: I moved to Boston.", "Melanie: I moved to Denver.", False),  # two people
    ("I live in Lisbon.", "My cousin moved to Porto.", False),
    ("Katrin is my manager.", "My new manager is Daniel Costa.", True),
    ("My girlfriend Sofia loves Porto.", "Lena and I are officially together now.", True),
    ("I'm in the A2 course.", "I'm in the B1 course now.", True),
    ("Also trying to learn guitar.", "I'm switching from guitar to piano.", True),
    ("I bought a Pixel 8.", "I got a Pixel 9 on Friday.", True),
    ("I bought a Pixel 8.", "My Pixel 8 screen cracked.", False),
    ("Reading Dune at the moment.", "I'm reading Klara and the Sun.", True),
    ("I work as a data engineer.", "Being an analytics engineer is new to me.", True),
    ("Started at Siemens on Monday.", "First week at Zalando done.", True),
    ("We pay 780 a month.", "Lena found us a flat in Mitte, 1,450 warm.", True),
]


@pytest.mark.parametrize(("text", "attribute", "value"), SETS)
def test_a_statement_sets_its_slot(text, attribute, value):
    found = {(s.attribute, s.value) for s in slots(text) if not s.ends}
    assert (attribute, value) in found, slots(text)
    assert all(s.holder == SELF for s in slots(text))


@pytest.mark.parametrize("text", NONE)
def test_other_statements_set_none(text):
    assert [s for s in slots(text) if not s.ends] == []


@pytest.mark.parametrize(("text", "attribute", "value"), ENDS)
def test_an_ending_names_what_it_ends(text, attribute, value):
    assert Slot(SELF, attribute, value, ends=True) in slots(text)


def test_a_named_speaker_holds_their_own_slots():
    assert slots("Caroline: I moved to Boston in May.") == [Slot("caroline", "residence", "boston")]


def replaces(older: str, newer: str) -> bool:
    new = {s.key: s for s in slots(newer) if not s.ends}
    return any(
        s.key in new and not new[s.key].same_value(s.value) for s in slots(older) if not s.ends
    )


def test_labelled_pairs_are_all_decided_right():
    wrong = [(a, b, want) for a, b, want in PAIRS if replaces(a, b) != want]
    assert wrong == []
