"""The date resolver alone on a set of dated turns: does it find the day a turn tells of?

``bench/data/dated-turns.json`` holds 130 chat messages written for this (2026-12-07) by a
helper given only a list of the ways people name a day (relative days, weekdays by tense,
weekends, days of the month, named dates, holidays of several countries, a day after other
numbers, no day at all), each with the moment it was said and the day it tells of, computed
with Python's datetime. Each is given to :func:`~inferscale_core.turn_dates.resolve_date` with
its moment; right is the labelled day (a turn naming none: the local day said).
``bench/data/dated-turns-2.json`` holds 150 more, written the same way by a second helper
(2026-12-07, a third session), with more countries' holidays, figures, fuzzy parts of months
and requests that name a day; 98 were right when it came, before anything was read of it.
``bench/data/dated-turns-3.json`` holds 150 more by a third helper (2026-12-07, an eighth
session), which saw neither the resolver nor the earlier sets and computed every label with
a stated rule (offsets from named days, holidays of seven countries, days that are no days);
124 were right when it came.

``python -m bench.dated_turns [--data PATH] [--json PATH]`` prints the misses and ``right/n``.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from inferscale_core.turn_dates import resolve_date

DEFAULT = Path(__file__).parent / "data" / "dated-turns.json"


def score(turns: list[dict[str, str]]) -> dict[str, object]:
    """``{"n", "right", "misses": [{"id", "said_at", "label", "got", "text"}]}``."""
    misses = []
    for turn in turns:
        said = datetime.fromisoformat(turn["said_at"])
        got = resolve_date(turn["text"], said) or said.date()
        if got.isoformat() != turn["date"]:
            misses.append({**turn, "label": turn["date"], "got": got.isoformat()})
    return {"n": len(turns), "right": len(turns) - len(misses), "misses": misses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dated_turns", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    result = score(json.loads(args.data.read_text(encoding="utf-8")))
    for miss in result["misses"]:  # type: ignore[union-attr]
        print(
            f"{miss['id']} said {miss['said_at']} label {miss['label']} got {miss['got']}: "
            f"{miss['text']}"
        )
    print(f"{result['right']}/{result['n']} dated turns right")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
