"""Scoring LoCoMo answers: token F1 as LoCoMo computes it, KL between two answer paths, a judge.

F1 follows ``task_eval/evaluation.py`` of snap-research/LoCoMo (commit cbfbc1d):
``normalize_answer`` drops commas, lower-cases, removes punctuation and the words
a/an/the/and, and every token is Porter-stemmed (NLTK's ``PorterStemmer()``, as LoCoMo).
Categories 2 (temporal), 3 (open-domain, gold cut at the first ``;``) and 4 (single-hop) use
plain F1; category 1 (multi-hop) splits prediction and gold on commas and averages, over the
gold parts, the best F1 of any predicted part. Category 5 is not scored (excluded).

KL: :func:`kl_top` compares two next-token distributions given as vLLM's top-n logprobs.
Intervals: :func:`bootstrap_ci` resamples questions (a question and all it carries is one item).
"""

from __future__ import annotations

import math
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from inferscale_core.composer import render_chat

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = frozenset(string.punctuation)


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    from nltk.stem import PorterStemmer

    return PorterStemmer()


def normalize_answer(text: str) -> str:
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _stems(text: str) -> list[str]:
    stem = _stemmer().stem
    return [stem(word) for word in normalize_answer(text).split()]


def f1_score(prediction: str, gold: str) -> float:
    """Stemmed token F1 of one prediction against one gold answer."""
    pred, ref = _stems(prediction), _stems(gold)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_multi(prediction: str, gold: str) -> float:
    """Category 1: mean over the gold's comma-separated parts of the best part F1."""
    predictions = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(f1_score(p, g) for p in predictions) for g in golds) / len(golds)


def locomo_f1(category: int, prediction: str, gold: str) -> float:
    """The F1 LoCoMo's evaluation gives an answer of ``category`` (1-4)."""
    if category == 1:
        return f1_multi(prediction, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    if category in (2, 3, 4):
        return f1_score(prediction, gold)
    raise ValueError(f"category {category} is not scored with F1")


def kl_top(p: Mapping[int, float], q: Mapping[int, float]) -> tuple[float, float]:
    """KL(P ‖ Q) from two top-n logprob dicts (token id -> logprob), in nats.

    The sum runs over P's top-n tokens plus one "rest" bin holding the mass outside them on
    each side. A P token missing from Q's top-n gets Q's smallest listed logprob (an upper
    bound on its true value, so the term is, if anything, underestimated). Returns
    ``(kl, p_mass_imputed)``: the second is the P-mass whose Q value was imputed that way.
    """
    q_floor = min(q.values())
    kl = p_mass = q_mass = imputed = 0.0
    for token, lp in p.items():
        prob = math.exp(lp)
        lq = q.get(token)
        if lq is None:
            lq = q_floor
            imputed += prob
        kl += prob * (lp - lq)
        p_mass += prob
        q_mass += math.exp(lq)
    p_rest, q_rest = max(0.0, 1.0 - p_mass), max(1e-12, 1.0 - q_mass)
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(0.0, kl), imputed


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def ratio_of_sums(pairs: Sequence[tuple[float, float]]) -> float | None:
    """``sum(a) / sum(b)`` over ``(a, b)`` pairs; None when the b's sum to 0."""
    base = sum(b for _, b in pairs)
    return sum(a for a, _ in pairs) / base if base else None


def mean_difference(pairs: Sequence[tuple[float, float]]) -> float | None:
    """``mean(a - b)`` over ``(a, b)`` pairs."""
    return mean([a - b for a, b in pairs])


Item = TypeVar("Item")


def bootstrap_ci(
    items: Sequence[Item],
    statistic: Callable[[Sequence[Item]], float | None],
    rounds: int = 2000,
    seed: int = 0,
) -> list[float] | None:
    """95% interval of ``statistic`` over ``items`` drawn with replacement, ``rounds`` times
    (percentile bootstrap; draws where the statistic is None are left out)."""
    if not items:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(rounds):
        value = statistic([items[rng.randrange(len(items))] for _ in items])
        if value is not None:
            values.append(value)
    if not values:
        return None
    values.sort()
    return [values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]]


JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"label": {"enum": ["CORRECT", "WRONG"]}},
    "required": ["label"],
    "additionalProperties": False,
}

JUDGE_INSTRUCTIONS = (
    "You label an answer to a question as CORRECT or WRONG, given the gold answer. Be generous:"
    " an answer is CORRECT if it refers to the same thing as the gold answer, even if it is"
    " longer or worded differently; for dates, the same day, month or period counts. Reply"
    ' with JSON: {"label": "CORRECT"} or {"label": "WRONG"}.'
)


def judge_prompt_ids(tokenizer: Any, question: str, gold: str, answer: str) -> list[int]:
    messages = [
        {"role": "system", "content": JUDGE_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"Question: {question}\nGold answer: {gold}\nGenerated answer: {answer}",
        },
    ]
    text = render_chat(tokenizer, messages)
    return tokenizer.encode(text, add_special_tokens=False)


def judge(engine: Any, tokenizer: Any, question: str, gold: str, answer: str) -> bool | None:
    """True/False from a local judge model (JSON-constrained); None if its output is unusable."""
    import json

    raw = engine.generate_json(
        judge_prompt_ids(tokenizer, question, gold, answer), JUDGE_SCHEMA, 16
    )
    try:
        return json.loads(raw)["label"] == "CORRECT"
    except (ValueError, KeyError, TypeError):
        return None
