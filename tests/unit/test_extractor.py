"""Fact extraction: the deterministic extractor and the validation of structured output."""

from __future__ import annotations

import json
from datetime import date, datetime

import pytest

from inferscale_core.extractor import (
    DeterministicExtractor,
    FactOp,
    InvalidOperations,
    LLMExtractor,
    parse_operations,
    resolve_date,
    sentence_kind,
    split_tail_ask,
    strip_filler,
)
from inferscale_core.types import Fact, Turn

MAY8 = datetime(2023, 5, 8, 13, 56)


def _fact(fid: int, text: str) -> Fact:
    return Fact(fid, 1, text, None, [], "active", None, MAY8)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I adopted a cat.", date(2023, 5, 8)),
        ("Yesterday I went to a support group.", date(2023, 5, 7)),
        ("I'll fly to Lisbon tomorrow", date(2023, 5, 9)),
        ("We moved 3 days ago", date(2023, 5, 5)),
        ("two weeks ago I started the cello", date(2023, 4, 24)),
        ("Last month I ran a half marathon", date(2023, 4, 1)),
        ("last year we went to Japan", date(2022, 1, 1)),
    ],
)
def test_relative_dates_resolve_against_the_turn(text, expected):
    assert resolve_date(text, MAY8) == expected


def test_filler_is_stripped():
    assert strip_filler("Um, well, so I   finally bought a bike lol") == "I finally bought a bike"
    assert strip_filler("haha ok") == ""


def test_substantive_user_turn_becomes_a_dated_fact():
    ops = DeterministicExtractor().extract(Turn("user", "Oh, yesterday I adopted a cat!", MAY8))
    assert ops == [FactOp("add", "Yesterday I adopted a cat!", date(2023, 5, 7))]


def test_named_speaker_is_kept_and_assistant_ignored():
    extractor = DeterministicExtractor()
    ops = extractor.extract(Turn("Caroline", "I went to an LGBTQ support group today.", MAY8))
    assert ops[0].text == "Caroline: I went to an LGBTQ support group today."
    assert extractor.extract(Turn("assistant", "That sounds like a lovely day out!", MAY8)) == []


@pytest.mark.parametrize(
    "text",
    ["ok thanks", "lol", "What time is it in Tokyo?", "hi there", "What is the name of my cat?"],
)
def test_small_talk_and_plain_questions_are_not_facts(text):
    assert DeterministicExtractor().extract(Turn("user", text, MAY8)) == []


def test_long_turns_are_split_at_sentences():
    text = " ".join(f"Sentence number {i} is about my garden and the tomatoes." for i in range(20))
    ops = DeterministicExtractor().extract(Turn("user", text, MAY8))
    assert len(ops) > 1
    assert all(len(op.text) <= 400 for op in ops)


def test_parse_operations_validates_schema_and_targets():
    similar = [_fact(7, "I live in Porto.")]
    raw = json.dumps(
        {
            "operations": [
                {"op": "update", "text": "I live in Lisbon.", "date": "2023-05-08", "target_id": 7},
                {"op": "add", "text": "I have a cat named Miso.", "date": None, "target_id": None},
            ]
        }
    )
    assert parse_operations(raw, similar) == [
        FactOp("update", "I live in Lisbon.", date(2023, 5, 8), 7),
        FactOp("add", "I have a cat named Miso.", None, None),
    ]
    twice = json.dumps(
        {
            "operations": [
                {"op": "update", "text": "I live in Lisbon.", "target_id": 7},
                {"op": "delete", "text": "I live in Porto.", "target_id": 7},
            ]
        }
    )
    with pytest.raises(InvalidOperations, match="two operations"):
        parse_operations(twice, similar)
    bad_target = json.dumps({"operations": [{"op": "delete", "text": "xyz", "target_id": 99}]})
    with pytest.raises(InvalidOperations):
        parse_operations(bad_target, similar)
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        parse_operations('{"operations": [{"op": "shout", "text": "x"}]}', similar)


class _BrokenEngine:
    def generate_json(self, prompt_ids, schema, max_tokens=256):
        return '{"operations": [{"op": "add"'  # truncated: fails validation


class _Tokenizer:
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [1, 2, 3]


def test_llm_extractor_falls_back_on_invalid_output():
    extractor = LLMExtractor(_BrokenEngine(), _Tokenizer())
    ops = extractor.extract(Turn("user", "I started learning the cello this week.", MAY8))
    assert ops and ops[0].op == "add"
    assert extractor.fallbacks == 1


def test_statements_are_kept_and_questions_dropped_from_a_turn():
    ops = DeterministicExtractor().extract(
        Turn("user", "I moved to Lisbon last week. What should I see first?", MAY8)
    )
    assert [op.text for op in ops] == ["I moved to Lisbon last week."]
    assert ops[0].refers_to == date(2023, 5, 1)


def test_a_discourse_word_is_filler_only_before_a_pause_or_a_clause():
    assert strip_filler("So much for the diet, I ate two pizzas.") == (
        "So much for the diet, I ate two pizzas."
    )
    assert strip_filler("No one came to my party.") == "No one came to my party."
    assert strip_filler("No, I moved.") == "I moved."
    assert strip_filler("Well I quit my job.") == "I quit my job."


@pytest.mark.parametrize(
    "sentence, kind",
    [
        ("Tell me a joke about translators.", "asks"),
        ("Why is the sky blue", "asks"),
        ("Could you translate this please", "asks"),
        ("Another joke please, about cats.", "asks"),
        ("Let's try another one.", "asks"),
        ("Need dinner ideas a 9 year old won't riot over tho", "asks"),
        ("I need some tips for the interview on Friday.", "asks"),
        ("I need a new phone, mine died.", "tells"),
        ("Let's plan it for next month, I'm excited.", "tells"),
        ("That helps a bit.", "reacts"),
        ("Got it, that makes sense.", "reacts"),
        ("Thanks, that's where Ana lives.", "tells"),
        ("That was the best concert of my life.", "tells"),
        ("My dog Miso is grey.", "tells"),
        # news said in disbelief tells; a question in a statement's words still asks
        ("i have a date tmrw??", "tells"),
        ("We're getting a puppy?!", "tells"),
        ("I should quit??", "asks"),
        ("I have a question?", "asks"),
        ("Is it too soon??", "asks"),
    ],
)
def test_sentence_kinds(sentence, kind):
    assert sentence_kind(sentence) == kind


def test_a_request_tacked_onto_a_statement_is_cut_off():
    ops = DeterministicExtractor().extract(
        Turn(
            "user",
            "anyway the interview is a week on Friday, can you give me some practice questions?",
            datetime(2024, 5, 29, 12),
        )
    )
    assert [(op.text, op.refers_to) for op in ops] == [
        ("The interview is a week on Friday.", date(2024, 6, 7))  # "anyway" is filler
    ]
    assert split_tail_ask("We moved to Porto — how do I register with a doctor?") == [
        "We moved to Porto.",
        "how do I register with a doctor?",
    ]
    assert split_tail_ask("Can you help?") == ["Can you help?"]
    assert split_tail_ask("So, do you have any pets?") == ["So, do you have any pets?"]
    assert split_tail_ask("I told her, and she said no.") == ["I told her, and she said no."]


def test_a_turn_keeps_its_statements_and_drops_its_requests():
    ops = DeterministicExtractor().extract(
        Turn("user", "I work as a nurse now. Tell me a joke about nurses. Thanks!", MAY8)
    )
    assert [op.text for op in ops] == ["I work as a nurse now."]


def test_an_overlong_sentence_is_cut_between_words():
    text = "I planted " + ", ".join(f"tomato number {i}" for i in range(60)) + "."
    ops = DeterministicExtractor().extract(Turn("user", text, MAY8))
    assert len(ops) > 1 and all(len(op.text) <= 400 for op in ops)
    assert " ".join(op.text for op in ops) == text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I moved to Porto on 12 March.", date(2023, 3, 12)),
        ("I'll fly to Boston on 28 May.", date(2023, 5, 28)),
        ("I saw Ana last Saturday.", date(2023, 5, 6)),
        ("We went hiking last weekend.", date(2023, 5, 6)),  # the one just gone
        ("I started the job in September 2022.", date(2022, 9, 1)),
        ("I was in Rome from 3 to 5 April.", date(2023, 4, 3)),
    ],
)
def test_named_dates_weekdays_and_months_resolve_against_the_turn(text, expected):
    assert resolve_date(text, MAY8) == expected  # MAY8 is a Monday


@pytest.mark.parametrize(
    "text", ["We have 2 cats.", "My flat costs 900 a month.", "I may go back to university."]
)
def test_numbers_and_words_that_are_not_dates_keep_the_turns_day(text):
    assert resolve_date(text, MAY8) == date(2023, 5, 8)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        # the misses of 170 turns written for this (a helper given only what a fact is): 136
        # right before, 161 after; re-worded here
        # a request and a statement in one sentence, apart by a comma, a colon or a dash
        ("Tell me a joke, I need cheering up, my hamster Biscuit died this morning.",
         ["I need cheering up, my hamster Biscuit died this morning."]),
        ("Help me plan a budget: I earn about $3,900 a month and my rent's $1,450.",
         ["I earn about $3,900 a month and my rent's $1,450."]),
        ("We're flying to Crete on the 12th - what should I pack?",
         ["We're flying to Crete on the 12th."]),
        ("What's a good warm-up for swimmers — I've joined a masters squad in Leith",
         ["I've joined a masters squad in Leith."]),
        ("cheers for that. we've moved Ava to homeschooling, what books would you recommend",
         ["We've moved Ava to homeschooling."]),
        ("Never mind the recipe, my parents cancelled, they're not coming for Easter.",
         ["My parents cancelled, they're not coming for Easter."]),
        # requests, reactions and greetings alone are no facts
        ("Add eggs and butter to my shopping list.", []),
        ("Generate three names for our five-a-side team.", []),
        ("nah, the second draft was better", []),
        ("cheers, that's spot on", []),
        ("forget I said anything", []),
        ("so much for that idea then", []),
        ("Write a limerick for my dad's card, something cheeky but kind.", []),
        ("Morning! Had my first swimming lesson yesterday and swallowed half the pool",
         ["Had my first swimming lesson yesterday and swallowed half the pool"]),
        # news told as a question
        ("Did I tell you my sister's moving to Perth in March?",
         ["Did I tell you my sister's moving to Perth in March?"]),
        ("guess who passed her driving test?? me!!", ["Guess who passed her driving test?? Me!!"]),
        ("Did you know my aunt Ivo keeps the yellow tent in the garden shed now.",
         ["Did you know my aunt Ivo keeps the yellow tent in the garden shed now."]),
        ("did you know honey never goes off?", []),
        ("Added a shelf in the hall and it's level for once.",
         ["Added a shelf in the hall and it's level for once."]),
        # the misses of 150 more (a second helper, the same brief): 127 right before, 143
        # after; re-worded here. A question with its verb first, a condition of a question,
        # "kindly" and "pls", reactions to the chat, an emoji ending a sentence
        ("is it going to snow all weekend or what", []),
        ("can u help write a short thank you email to her", []),
        ("update: sat the exam last Friday and I reckon I passed??",
         ["Sat the exam last Friday and I reckon I passed??"]),
        ("If I sold the car, would the bus really be cheaper?", []),
        ("Kindly recommend a dentist near Koramangala, we are moving to Bangalore in June.",
         ["We are moving to Bangalore in June."]),
        ("pls list some stretches for my back", []),
        ("Set an alarm for 5am, I've got a flight to Oslo.", ["I've got a flight to Oslo."]),
        ("Wow, I didn't know that!", []),
        ("Sorry, I meant the first one.", []),
        ("You're a lifesaver, honestly", []),
        ("My neighbour's dog barks all night 😩 what can I do about it?",
         ["My neighbour's dog barks all night 😩"]),
        ("Great answer 👍 Also my son Theo is left-handed, so ignore the scissors tip.",
         ["Also my son Theo is left-handed."]),
    ],
)  # fmt: skip
def test_what_a_turn_tells_is_kept_and_what_it_asks_is_not(text, kept):
    ops = DeterministicExtractor().extract(Turn("user", text, MAY8))
    assert [op.text for op in ops] == kept
