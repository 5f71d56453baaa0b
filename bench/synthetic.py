"""Deterministic synthetic memory facts of a target token length (no data set needed)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date, timedelta

from inferscale_core.prompt_builder import MemoryFact

_NAMES = ["Ana", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun"]
_PLACES = [
    "Lisbon",
    "the lake house",
    "Osaka",
    "the climbing gym",
    "her office",
    "Nairobi",
    "the old bakery",
    "Tromsø",
    "the night market",
    "his parents' farm",
]
_THINGS = [
    "a second-hand cello",
    "a red road bike",
    "sourdough starter",
    "a book on Roman roads",
    "a tiny bonsai",
    "hiking boots",
    "a film camera",
    "a chess set",
    "a kayak",
    "a telescope",
]
_PLANS = [
    "run a half marathon",
    "learn Portuguese",
    "repaint the kitchen",
    "visit the fjords",
    "start a vegetable garden",
    "finish the thesis",
    "adopt a rescue dog",
    "build a bookshelf",
]
_FILLERS = [
    "which surprised everyone",
    "after a long week of rain",
    "despite the budget",
    "on a whim",
    "together with two old friends",
    "because the doctor suggested it",
    "while the kids were at camp",
    "right before the holidays",
]


def synthetic_facts(
    n: int,
    count_tokens: Callable[[str], int],
    target_tokens: int = 50,
    seed: int = 0,
) -> list[MemoryFact]:
    """``n`` distinct dated facts of about ``target_tokens`` tokens each."""
    rng = random.Random(seed)
    start = date(2023, 1, 1)
    facts = []
    for i in range(n):
        text = (
            f"{rng.choice(_NAMES)} told me at {rng.choice(_PLACES)} that they bought"
            f" {rng.choice(_THINGS)} {rng.choice(_FILLERS)}, and plan to {rng.choice(_PLANS)}"
            f" before {rng.choice(_NAMES)} comes back (note {i})."
        )
        while count_tokens(text) < target_tokens:
            text = text[:-1] + f", {rng.choice(_FILLERS)}."
        facts.append(MemoryFact(text, start + timedelta(days=3 * i)))
    return facts
