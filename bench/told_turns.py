"""The deterministic extractor alone on a set of chat turns: does it keep what a turn tells and
drop what it asks?

``bench/data/told-turns.json`` holds 170 messages to the assistant written for this
(2026-12-07) by a helper given only what the memory keeps (what a message tells of the user's
life) and drops (requests, questions, jokes asked for, thanks, reactions, filler), each marked
``none`` (70: nothing to keep), ``fact`` (50) or ``mixed`` (50: a fact and a request or a
reaction), with phrases that must be kept (``keep``) and phrases that must not (``drop``).
``bench/data/told-turns-2.json`` holds 150 more by a second helper, the same brief (55 none,
50 fact, 45 mixed; 127 right when it came). A ``none`` turn is right when it makes no fact;
the others when the facts made hold every ``keep`` phrase and no ``drop`` phrase (case aside).

``python -m bench.told_turns [--data PATH] [--json PATH]`` prints the misses and ``right/n`` of
each kind.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.types import Turn

DEFAULT = Path(__file__).parent / "data" / "told-turns.json"
KINDS = ("none", "fact", "mixed")
SAID = datetime(2025, 6, 4, 12)  # the day every turn is said (no turn's right depends on it)


def score(turns: list[dict]) -> dict[str, object]:
    """``{"right": {kind: n}, "n": {kind: n}, "misses": [{"id", "kind", "text", "kept"}]}``."""
    extractor = DeterministicExtractor()
    right = dict.fromkeys(KINDS, 0)
    count = dict.fromkeys(KINDS, 0)
    misses = []
    for turn in turns:
        kept = " ".join(op.text for op in extractor.extract(Turn("user", turn["text"], SAID)))
        low = kept.casefold()
        if turn["kind"] == "none":
            ok = not kept
        else:
            ok = all(p.casefold() in low for p in turn["keep"]) and not any(
                p.casefold() in low for p in turn["drop"]
            )
        count[turn["kind"]] += 1
        right[turn["kind"]] += ok
        if not ok:
            misses.append(
                {"id": turn["id"], "kind": turn["kind"], "text": turn["text"], "kept": kept}
            )
    return {"right": right, "n": count, "misses": misses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.told_turns", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    result = score(json.loads(args.data.read_text(encoding="utf-8")))
    for miss in result["misses"]:  # type: ignore[union-attr]
        print(f"{miss['id']} {miss['kind']}: {miss['text']}\n    kept: {miss['kept']!r}")
    right, n = result["right"], result["n"]
    parts = ", ".join(f"{kind} {right[kind]}/{n[kind]}" for kind in KINDS)  # type: ignore[index]
    print(f"{sum(right.values())}/{sum(n.values())} told turns right ({parts})")  # type: ignore[union-attr]
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
