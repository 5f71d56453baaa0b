"""Facets: which part of one's life a question about the present asks of, and the retriever
step that puts the latest statement of it first (inferscale_core.facets; the real MiniLM)."""

from __future__ import annotations

from datetime import date

import numpy as np
import pytest
import torch

import inferscale_core.facets as facets_module
import inferscale_core.retriever as retriever_module
from inferscale_core.facets import FACETS, Facets
from inferscale_core.retriever import Retriever
from tests.unit.test_retriever_newer import ranked  # the top 5, best first, asked on 2025-12-20


@pytest.fixture(scope="module")
def facets(minilm):
    return Facets(minilm)


@pytest.mark.parametrize(
    ("question", "facet"),
    [
        ("Where do I live these days?", "home"),
        ("What car do I have?", "vehicle"),
        ("Do I have any pets?", "pet"),
        ("How do I get to the office?", "commute"),
        ("Who is my girlfriend?", "partner"),
        ("How much money do I make?", "pay"),
        ("What is my boss called?", "boss"),
        # parts of a life that hold one value each, told apart from their neighbours
        ("Which dentist do I see?", "dentist"),
        ("Which GP practice am I registered with?", "doctor"),
        ("What laptop am I working on?", "computer"),
        ("Which handset do I use?", "phone"),
        ("What charity do I help out at?", "volunteering"),
        # questions about no part of a life, or about an event, ask about none
        ("What's the capital of France?", None),
        ("Tell me something funny.", None),
        ("When is my mother's birthday?", None),
        ("What did we eat on Sunday?", None),
    ],
)
def test_a_question_asks_about_its_facet_or_none(facets, minilm, question, facet):
    found = facets.of(minilm.embed([question]))
    assert (found and found[0]) == facet, found


def test_prototypes_are_unit_rows_one_per_facet(facets, minilm):
    protos = facets.prototypes()
    assert protos.shape == (len(FACETS), minilm.dim)
    assert protos.norm(dim=1).sub(1).abs().max() < 1e-5
    # a statement of a facet in other words is nearest that facet's prototype
    said = minilm.embed(["Picked up a second-hand Toyota Yaris hybrid on Saturday."])
    assert facets.nearest(said) == ["vehicle"]
    query = minilm.embed(["What do I drive now?"])
    steered = facets.steer(query)
    assert steered is not None and abs(float(steered.norm()) - 1) < 1e-5
    assert facets.steer(minilm.embed(["What's the capital of France?"])) is None


def test_the_examples_are_embedded_once_and_read_from_the_cache(minilm, tmp_path, monkeypatch):
    """A second process reads the examples' embeddings from the cache folder instead of
    embedding ~490 texts again; a damaged cache file is embedded again and replaced."""
    monkeypatch.setenv("INFERSCALE_CACHE", str(tmp_path))
    monkeypatch.setattr(facets_module, "_EXAMPLES", {})  # a fresh process
    made = Facets(minilm).prototypes()
    (cached,) = tmp_path.glob("facets-*.npy")
    assert cached.stat().st_mode & 0o777 == 0o600
    texts, _, _ = facets_module._example_texts()
    assert np.load(cached).shape == (len(texts), minilm.dim)

    class Counting:  # the same embedder, counting the texts it embeds
        name, dim, embedded = minilm.name, minilm.dim, 0

        def embed(self, texts):
            Counting.embedded += len(texts)
            return minilm.embed(texts)

    monkeypatch.setattr(facets_module, "_EXAMPLES", {})
    assert torch.equal(Facets(Counting()).prototypes(), made)
    assert Counting.embedded == 0  # read, not embedded
    cached.write_bytes(b"not an array")
    monkeypatch.setattr(facets_module, "_EXAMPLES", {})
    assert torch.allclose(Facets(Counting()).prototypes(), made, atol=1e-6)
    assert Counting.embedded == len(texts)
    assert np.load(cached).shape == (len(texts), minilm.dim)  # replaced


LIFE = [
    ("I drive a battered blue Peugeot 206, it never lets me down.", date(2024, 3, 2)),
    ("The bus into town is always late on Mondays.", date(2024, 4, 9)),
    ("My neighbour's son is learning to drive.", date(2024, 6, 1)),
    ("Cycling to the station is faster than the bus.", date(2024, 9, 3)),
    (
        "Picked up a second-hand Toyota Yaris hybrid on Saturday, so much smoother.",
        date(2025, 5, 10),
    ),
    ("I eat everything, no allergies or restrictions at all.", date(2024, 2, 1)),
    ("The doctor says I am lactose intolerant, so cheese is off the menu.", date(2025, 4, 2)),
    ("I love cooking Thai curries for friends.", date(2024, 8, 8)),
    ("We went to the seaside for my birthday.", date(2025, 6, 14)),
    ("I walk the dog along the canal every evening.", date(2025, 7, 1)),
]


def test_a_change_said_in_other_words_goes_first(log, minilm, monkeypatch):
    """The new car and the new diet name neither the old car nor "restrictions": MiniLM puts
    the old statements first; the facet step puts the latest statement of the facet first."""
    p = log.profile()
    for text, when in LIFE:
        log.add_fact(p, text, when)
    retriever = Retriever(log, minilm)
    old_car, new_car = LIFE[0][0], LIFE[4][0]
    old_diet, new_diet = LIFE[5][0], LIFE[6][0]
    car = ranked(retriever, p, "What do I drive now?")
    diet = ranked(retriever, p, "Is there anything I cannot eat?")
    assert car[0] == new_car and old_car in car, car
    assert diet[0] == new_diet and old_diet in diet, diet
    past_question = "What did I drive in 2024?"
    past = ranked(retriever, p, past_question)
    # the step is what does it: without it the older statements lead
    monkeypatch.setattr(retriever_module, "FACETED", False)
    plain = ranked(retriever, p, "What do I drive now?")
    assert plain.index(old_car) < plain.index(new_car), plain
    assert ranked(retriever, p, "Is there anything I cannot eat?")[0] == old_diet
    # and a question about the past is not steered
    assert ranked(retriever, p, past_question) == past


CAR = [
    ("I'm not buying another bike, honestly. I got the Deutschlandticket instead, the S-Bahn is"
     " fine.", date(2024, 10, 16)),
    ("I ride my old Gazelle bike to the office along the river.", date(2024, 5, 2)),
    ("Less fun: Marie's new school is in Bergisch Gladbach and the train connection is awful, so"
     " we bought a car on Saturday, a 2017 Fabia we named Rasam.", date(2025, 10, 19)),
    ("The weather has been grim all week.", date(2025, 11, 2)),
    ("Dinner with Anna's parents went well.", date(2025, 3, 3)),
]  # fmt: skip


def test_a_change_told_among_other_things_keeps_its_place_above_the_older(log, minilm, monkeypatch):
    """The car is bought in a turn about a school: it is about "school" alone, so the facet
    step's newest statement of "vehicle" is the older ticket; the step puts that one below
    the first hits said after it, not above the car."""
    p = log.profile()
    for text, when in CAR:
        log.add_fact(p, text, when)
    retriever = Retriever(log, minilm)
    ticket, car = CAR[0][0], CAR[2][0]
    assert Facets(minilm).about(minilm.embed([car])) == [frozenset({"school"})]
    assert ranked(retriever, p, "What car do we have now?")[:2] == [car, ticket]
    monkeypatch.setattr(retriever_module, "FACET_ABOVE", 0)  # the step as it was
    assert ranked(retriever, p, "What car do we have now?")[:2] == [ticket, car]


def test_a_turn_telling_two_things_is_about_both(minilm, facets, monkeypatch):
    """Within FACET_SHARED of its best facet: "a free room ... 890 a month" is home and rent
    (0.40 and 0.39 on fp32 MiniLM), a plain statement of rent is rent alone (0.49, pay 0.38).
    The margins asserted are wide of the embedder's precision (int8 moves a cosine ~0.01)."""
    said = minilm.embed(
        [
            "Olivier from work has a free room in his place in Verdun, 890 a month. I move in"
            " on March 1.",
            "My half of the rent is 740 which is a steal for the Plateau.",
        ]
    )
    best = facets.nearest(said)
    assert best[0] in {"home", "rent"} and best[1] == "rent"
    monkeypatch.setattr(facets_module, "FACET_SHARED", 0.0)
    assert facets.about(said) == [frozenset({best[0]}), frozenset({"rent"})]
    monkeypatch.setattr(facets_module, "FACET_SHARED", 0.05)
    both = facets.about(said)
    assert {"home", "rent"} <= both[0] and both[1] == frozenset({"rent"})
    assert facets.about(said[:0]) == []


WORK = [
    ("I'm a staff nurse on the cardiac ward at St Mary's, mostly night shifts.", date(2024, 3, 2)),
    ("They've moved me up to senior nurse from November, with two students to look after.",
     date(2024, 10, 26)),
    ("They offered it to me! Last day at St Mary's is 23 May, and I start as a paramedic in"
     " Leeds on 2 June, so it's time to find a flat up there.", date(2025, 4, 12)),
    ("The new flat gets the morning sun, I love it.", date(2025, 6, 1)),
]  # fmt: skip


def test_what_replaced_a_statement_of_the_facet_is_one_too(log, minilm, monkeypatch):
    """The new job is told with a move: its nearest facet is "home", not "work", yet it
    replaced "I'm a staff nurse" (a role slot), so it stands for the facet too and, being the
    newest of it, goes first."""
    p = log.profile()
    ids = [log.add_fact(p, text, when)[0] for text, when in WORK]
    for fid in ids:
        log.close_replaced(fid)
    retriever = Retriever(log, minilm)
    offer = WORK[2][0]
    assert log.open_successors([ids[0]]) == {ids[0]: [ids[2]]}  # the slots closed the nurse
    assert Facets(minilm).nearest(minilm.embed([offer])) == ["home"]
    question = "What's my current position at work?"
    assert ranked(retriever, p, question)[0] == offer
    # no successors read (by this step and by the closed-fact step after it): it is not first
    monkeypatch.setattr(log, "open_successors", lambda ids: {})
    assert ranked(retriever, p, question)[0] != offer
