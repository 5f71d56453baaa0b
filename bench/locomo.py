"""``bench locomo``: question answering on LoCoMo, KV injection against prompt injection.

For every sampled question (categories 1-4; a fixed-seed sample for CI-sized runs) the top
``max(ks)`` facts are retrieved once (:mod:`~bench.locomo_data`); each k uses
the best k of them, in the same order (best last) for every mode. Modes, same model, same
greedy decoding, same question text:

* ``prompt`` — prompt injection: the k fact lines prefilled as text;
* ``inject_w<w>`` — KV injection of the same fact lines, each encoded after the system prefix
  and its w preceding conversation turns (w=0: the prefix alone); ``inject_w<w>a`` the same
  with the anchored window of that w (:mod:`inferscale_core.context_window`);
* ``inject_w<w>_r<r>`` (with ``rs``) — the tail-recompute hybrid: the k−r lower-ranked facts
  injected as above, the r best ones prefilled as text after them, with the question
  (``PromptBuilder.build(recompute=r)``), so they attend to every injected fact. Only r < k
  is run: r = k is prompt injection by construction (the same token ids, nothing injected);
  r = 0 is ``inject_w<w>``. Each r has a prefix-cache salt of its own
  (``PromptBuilder.cache_salt``): the hybrid's ids equal the plain injection's, and the same
  batch must not serve one's tail blocks from the other's;
* ``reorder`` (with ``reference=("reorder",)``) — prompt injection of the same facts in another,
  seeded order: not a product mode but the yardstick for the others, i.e. how far answers and
  next-token distributions move under a change that should not matter.

Answers are scored with LoCoMo's own token F1 (:mod:`~bench.locomo_score`),
per category. Because a 135M model answers poorly, the answers' next-token distributions are
compared too: along the prompt-injection answer (teacher-forced), mean KL(prompt ‖ injection)
per answer token from vLLM's top-``logprobs`` logprobs, and how often the two argmaxes agree.
Every cell also keeps the median tokens the engine prefilled (``computed_tokens_median``) and
loaded from the store (``injected_tokens_median``): the hybrid's price in prefill.
Where the injected run's greedy answer leaves the prompt-injection answer, a new injected
request continues from the prompt-injection answer's tokens (so every position is scored
on the same prefix), reusing the cached span (:class:`Forcing`).

Questions are answered ``batch`` at a time, every request of a round submitted to the engine
at once (decoding is memory-bound on a CPU: a batch costs little more than one request). So
the answers' ``ttft_s`` count from a batch's submission and are not latency figures (those
come from ``bench ttft``, and for the hybrid from ``bench ttft --recompute`` and the GPU
suite's ``recompute`` part). Everything needed to re-score is saved in the JSON (``bench locomo
--rescore``), written after every batch so a long run can be followed and resumed.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import locomo_data
from bench.arguments import window_of
from bench.locomo_data import CATEGORIES, LocomoMemory, Question
from bench.locomo_score import bootstrap_ci, judge, kl_top, locomo_f1, mean, ratio_of_sums
from bench.report import figure, footnote, provenance, save_figure, write_json
from inferscale_core.composer import ChatLayout, ComposedPrompt
from inferscale_core.prompt_builder import MemoryFact, PromptBuilder
from inferscale_core.types import Fact, GenerationResult

SYSTEM_PROMPT = (
    "You answer questions about people from what you remember of their conversations."
    " Here is what you remember, with dates:"
)
QA_PROMPT = (
    "Based on the memories above, write an answer in the form of a short phrase for the"
    " following question. Answer with exact words from the memories whenever possible.\n\n"
    "Question: {question} Short answer:"
)
TEMPORAL_HINT = " Use the dates of the memories to answer with an approximate date."
SETTINGS = (
    "data", "sample", "seed", "ks", "ws", "rs", "max_tokens", "logprobs", "kl", "reference"
)  # fmt: skip
REFERENCES = ("reorder",)


def user_text(question: Question) -> str:
    """LoCoMo's QA prompt (category 2 gets its date hint, as in LoCoMo's own code)."""
    text = question.question + (TEMPORAL_HINT if question.category == 2 else "")
    return QA_PROMPT.format(question=text)


def inject_mode(spec: int | str, r: int = 0) -> str:
    """``inject_w20a`` (r=0), ``inject_w20a_r2`` (the 2 best facts recomputed)."""
    return f"inject_w{spec}" + (f"_r{r}" if r else "")


def modes(
    ws: Sequence[int | str],
    reference: Sequence[str] = (),
    rs: Sequence[int] = (0,),
    k: int | None = None,
) -> list[str]:
    """The modes in table order (per window, r ascending); with ``k``, those run at that k
    (r < k: r = k would be prompt injection)."""
    injected = [inject_mode(spec, r) for spec in ws for r in rs if k is None or r < k]
    return ["prompt", *injected, *reference]


def run_locomo(
    builder: PromptBuilder,
    engine: Any,  # VllmEngine
    data: Path,
    *,
    sample: int | None = 200,
    seed: int = 0,
    ks: Sequence[int] = (5, 20, 50),
    ws: Sequence[int | str] = (0, 20, "20a"),
    rs: Sequence[int] = (0,),
    max_tokens: int = 32,
    logprobs: int = 20,
    kl: bool = True,
    reference: Sequence[str] = (),
    batch: int = 8,
    json_path: Path | None = None,
    resume: dict[str, Any] | None = None,
    model_name: str = "",
    command: str | None = None,
    embedder: Any = None,
    retrieval: Path | None = None,
    scoring: bool = True,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Answer, score and return the JSON-ready result; saved to ``json_path`` as it goes.

    ``builder`` lends its encoder and store (its own system prompt is not used); ``resume`` is
    an earlier result of the same settings whose answered questions are kept. ``retrieval``
    is a file of :func:`export_retrieval` to answer on instead of retrieving (no embedder
    needed: a GPU machine without MiniLM answers on the facts MiniLM found elsewhere).
    ``rs`` are the numbers of best facts recomputed rather than injected (0: plain injection;
    an r >= k is skipped at that k).
    """
    unknown = set(reference) - set(REFERENCES)
    if unknown:
        raise ValueError(f"unknown reference mode(s): {', '.join(sorted(unknown))}")
    if not rs or min(rs) < 0:
        raise ValueError(f"rs needs whole numbers >= 0, got {list(rs)}")
    settings = {
        "data": str(data),
        "sample": sample,
        "seed": seed,
        "ks": sorted(ks),
        "ws": list(ws),
        "rs": sorted(set(rs)),
        "max_tokens": max_tokens,
        "logprobs": logprobs,
        "kl": kl,
        "reference": list(reference),
    }
    saved = dict(resume["settings"]) if resume is not None else {}
    saved.setdefault("reference", [])  # runs from before reference modes existed
    saved.setdefault("rs", [0])  # runs from before tail recompute
    if resume is not None and {key: saved.get(key) for key in SETTINGS} != settings:
        raise ValueError("--resume: the saved run used other settings")
    result: dict[str, Any] = {
        **provenance("locomo", model_name, command),
        "settings": settings,
        "batch": batch,
        "system_prompt": SYSTEM_PROMPT,
        "qa_prompt": QA_PROMPT,
        "facts_source": "LoCoMo observations, dated with their session; retrieved by MiniLM",
        "facts": {},
        "questions": [],
    }
    done = {q["id"]: q for q in (resume or {}).get("questions", [])}
    if resume is not None:
        result["facts"] = dict(resume.get("facts", {}))
    chosen = locomo_data.sample_questions(
        locomo_data.questions(locomo_data.load(data)), sample, seed
    )
    layout = ChatLayout(builder.layout.tokenizer, SYSTEM_PROMPT)
    qa_builder = PromptBuilder(layout, builder.encoder, builder.store, builder.batch_size)
    on_progress("importing the sampled conversations")
    with locomo_data.temporary_memory(data, chosen) as memory:
        if retrieval is not None:
            hits = locomo_data.load_retrieval(retrieval, memory, chosen, max(ks))
            result["facts_source"] += f" (hits read from {Path(retrieval).name})"
        else:
            on_progress("retrieving")
            embedder = embedder if embedder is not None else locomo_data.default_embedder()
            hits = locomo_data.retrieve(memory, embedder, chosen, max(ks))  # best last
        todo = [q for q in chosen if q.id not in done]
        _encode_all(qa_builder, memory, [h.fact for q in todo for h in hits[q.id]], ws, on_progress)
        t0, answered = time.perf_counter(), 0
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            for q in chunk:
                for hit in hits[q.id]:
                    result["facts"][str(hit.fact.id)] = hit.fact.text
            records = _answer_chunk(qa_builder, engine, memory, chunk, hits, settings)
            done.update({record["id"]: record for record in records})
            answered += len(chunk)
            left = (time.perf_counter() - t0) / answered * (len(todo) - answered)
            on_progress(f"answered {answered}/{len(todo)} (~{left / 60:.0f} min left)")
            if json_path is not None:
                result["questions"] = [done[q.id] for q in chosen if q.id in done]
                if scoring:
                    result["scores"] = score(result)
                write_json(result, json_path)
        result["questions"] = [done[q.id] for q in chosen]
    if scoring:
        result["scores"] = score(result)
    if json_path is not None:
        write_json(result, json_path)
    return result


def export_retrieval(
    data: Path,
    path: Path,
    *,
    sample: int | None = 200,
    seed: int = 0,
    k: int = 50,
    embedder: Any = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Retrieve the top ``k`` facts of the sampled questions as :func:`run_locomo` does and
    write them to ``path`` (for ``run_locomo(retrieval=path)``, e.g. on another machine)."""
    chosen = locomo_data.sample_questions(
        locomo_data.questions(locomo_data.load(data)), sample, seed
    )
    embedder = embedder if embedder is not None else locomo_data.default_embedder()
    on_progress("importing the sampled conversations")
    with locomo_data.temporary_memory(data, chosen) as memory:
        on_progress(f"retrieving the top {k} facts of {len(chosen)} questions")
        hits = locomo_data.retrieve(memory, embedder, chosen, k)
    meta = {
        **provenance("locomo-retrieval", getattr(embedder, "name", type(embedder).__name__)),
        "data": str(data),
        "sample": sample,
        "seed": seed,
    }
    locomo_data.save_retrieval(path, hits, meta)
    return {"questions": len(hits), "k": k, "path": str(path)}


def _encode_all(
    builder: PromptBuilder,
    memory: LocomoMemory,
    facts: list[Fact],
    ws: Sequence[int | str],
    on_progress: Callable[[str], None],
) -> None:
    """Encode every fact the run will inject, per window, in the fact log's order (facts of
    a conversation together: an anchored window's shared turns hit the prefix cache)."""
    unique = sorted({f.id: f for f in facts}.values(), key=lambda f: f.id)
    for spec in ws:
        pending = [memory.memory_fact(f, *window_of(spec)) for f in unique]
        chunk = builder.batch_size * 4
        for start in range(0, len(pending), chunk):
            on_progress(f"w={spec}: encoding facts {start + 1}-{start + chunk} of {len(pending)}")
            builder.encode_many(pending[start : start + chunk])


class Forcing:
    """Q's next-token distributions along the prompt-injection answer (the target).

    The injected answer's own logprobs serve as long as its tokens equal the target's; at
    the first difference :meth:`next_prompt` is a new injected request that continues from
    the target's tokens so far (the original prompt's blocks are in the prefix cache).
    """

    def __init__(self, composed: ComposedPrompt | list[int], target: list[int]) -> None:
        self.composed = composed
        self.target = target
        self.steps: list[dict[int, float]] = []
        self.restarts = -1  # the first feed is the injected answer itself

    def feed(self, result: GenerationResult) -> None:
        self.restarts += 1
        start = len(self.steps)
        for offset, (token, step) in enumerate(
            zip(result.token_ids, result.logprobs, strict=False)
        ):
            if start + offset >= len(self.target):
                break
            self.steps.append(step)
            if token != self.target[start + offset]:
                break
        if len(self.steps) == start:  # nothing usable came back: stop rather than loop
            self.target = self.target[:start]

    def next_prompt(self) -> ComposedPrompt | list[int] | None:
        if len(self.steps) >= len(self.target):
            return None
        c = self.composed
        if not isinstance(c, ComposedPrompt):  # a plain prompt (a reference mode)
            return [*c, *self.target[: len(self.steps)]]
        ids = c.prompt_ids + self.target[: len(self.steps)]
        return ComposedPrompt(ids, c.entries, c.fact_keys, c.cache_salt)

    def report(self, prompt: GenerationResult) -> dict[str, Any]:
        kls, agree, imputed = [], [], []
        for p_step, q_step in zip(prompt.logprobs, self.steps, strict=False):
            value, missing = kl_top(p_step, q_step)
            kls.append(round(value, 6))
            imputed.append(round(missing, 6))
            agree.append(max(p_step, key=p_step.get) == max(q_step, key=q_step.get))
        return {
            "per_token": kls,
            "top1_agree": agree,
            "p_mass_imputed": imputed,
            "restarts": self.restarts,
        }


def _answer_chunk(
    builder: PromptBuilder,
    engine: Any,
    memory: LocomoMemory,
    chunk: Sequence[Question],
    hits: dict[str, list[Any]],
    settings: dict[str, Any],
) -> list[dict[str, Any]]:
    """Answer a few questions at once: every request of a round goes in one engine batch.

    Round 1: prompt injection for every (question, k); round 2: KV injection for every
    (question, k, w, r) (and the reference modes); then the KL continuations, round after
    round, until none is left.
    """
    gen = {"max_tokens": settings["max_tokens"], "logprobs": settings["logprobs"]}
    prompts: dict[tuple[int, str], Any] = {}  # (question #, cell) -> prompt
    for i, q in enumerate(chunk):
        text = user_text(q)
        for k in settings["ks"]:
            top = [hit.fact for hit in hits[q.id][-k:]]  # the best k, still best last
            memory_facts = [MemoryFact(f.text, f.refers_to) for f in top]
            prompts[(i, f"prompt@k{k}")] = builder.prompt_injection_ids(memory_facts, text)
            if "reorder" in settings["reference"]:
                shuffled = list(memory_facts)
                random.Random(f"{settings['seed']}/{q.id}/{k}").shuffle(shuffled)
                prompts[(i, f"reorder@k{k}")] = builder.prompt_injection_ids(shuffled, text)
            for spec in settings["ws"]:
                w, window = window_of(spec)
                facts_w = [memory.memory_fact(f, w, window) for f in top]
                for r in settings["rs"]:
                    if r >= k:  # all k recomputed: prompt injection, which prompt@k is
                        continue
                    prompts[(i, f"{inject_mode(spec, r)}@k{k}")] = builder.build(
                        facts_w, text, w=w, window=window, recompute=r
                    )
    results: dict[tuple[int, str], GenerationResult] = {}
    for first_round in (True, False):
        keys = [key for key in prompts if key[1].startswith("prompt@") == first_round]
        batch = engine.generate_batch([prompts[key] for key in keys], **gen)
        results.update(zip(keys, batch, strict=True))
    for key, result in results.items():
        if result.refused:
            raise RuntimeError(f"injection refused for {key}: {result.refused}")
    forcing: dict[tuple[int, str], Forcing] = {}
    if settings["kl"]:
        for (i, cell), result in results.items():
            if not cell.startswith("prompt@"):
                baseline = results[(i, "prompt@" + cell.split("@")[1])]
                forcing[(i, cell)] = Forcing(prompts[(i, cell)], baseline.token_ids)
                forcing[(i, cell)].feed(result)
        while pending := {key: f.next_prompt() for key, f in forcing.items() if f.next_prompt()}:
            longest = max(len(f.target) - len(f.steps) for f in forcing.values())
            batch = engine.generate_batch(
                list(pending.values()), **{**gen, "max_tokens": max(1, longest)}
            )
            for key, result in zip(pending, batch, strict=True):
                forcing[key].feed(result)
    records = []
    for i, q in enumerate(chunk):
        answers = {}
        for (j, cell), result in results.items():
            if j != i:
                continue
            answers[cell] = _record(result)
            if (i, cell) in forcing:
                baseline = results[(i, "prompt@" + cell.split("@")[1])]
                answers[cell]["kl"] = forcing[(i, cell)].report(baseline)
        records.append(
            {
                "id": q.id,
                "category": q.category,
                "question": q.question,
                "gold": q.answer,
                "evidence": list(q.evidence),
                "retrieved": [[hit.fact.id, round(hit.score, 4)] for hit in hits[q.id]],
                "answers": {cell: answers[cell] for cell in _cells(settings)},
            }
        )
    return records


def _record(result: GenerationResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "tokens": len(result.token_ids),
        "ttft_s": round(result.ttft_s or 0.0, 5),  # from the batch's submission
        "prompt_tokens": result.prompt_tokens,
        "computed_tokens": result.computed_tokens,
        "injected_tokens": result.injected_tokens,
    }


def score(result: dict[str, Any]) -> dict[str, Any]:
    """F1 per (mode, k), overall and per category; ratios to prompt injection with a paired
    bootstrap 95% interval; KL statistics; prefilled and loaded tokens; judged accuracy where
    judged. Cells no question has (a merged run's grid has some) are left out."""
    settings = result["settings"]
    records = result["questions"]
    out: dict[str, Any] = {"questions": len(records), "cells": {}}
    keys = _cells(settings)
    if records:
        keys = [key for key in keys if any(key in q["answers"] for q in records)]
    for key in keys:
        f1s = [
            locomo_f1(q["category"], q["answers"][key]["text"], q["gold"])
            for q in records
            if key in q["answers"]
        ]
        cell: dict[str, Any] = {"f1": mean(f1s), "n": len(f1s), "by_category": {}}
        for cat, name in CATEGORIES.items():
            values = [
                locomo_f1(cat, q["answers"][key]["text"], q["gold"])
                for q in records
                if q["category"] == cat and key in q["answers"]
            ]
            cell["by_category"][name] = {"f1": mean(values), "n": len(values)}
        judged = [q["answers"][key].get("judged") for q in records if key in q["answers"]]
        if any(j is not None for j in judged):
            cell["judged_accuracy"] = mean([float(j) for j in judged if j is not None])
        for name in ("computed_tokens", "injected_tokens"):
            counts = [q["answers"][key].get(name) for q in records if key in q["answers"]]
            if counts and None not in counts:
                cell[f"{name}_median"] = statistics.median(counts)
        mode, k = key.split("@")
        if mode != "prompt":
            baseline = f"prompt@{k}"
            pairs = [
                (
                    locomo_f1(q["category"], q["answers"][key]["text"], q["gold"]),
                    locomo_f1(q["category"], q["answers"][baseline]["text"], q["gold"]),
                )
                for q in records
                if key in q["answers"] and baseline in q["answers"]
            ]
            cell["f1_over_prompt"] = ratio_of_sums(pairs)
            cell["f1_over_prompt_ci95"] = bootstrap_ci(pairs, ratio_of_sums)
            cell["same_text_as_prompt"] = mean(
                [
                    float(
                        q["answers"][key]["text"].strip() == q["answers"][baseline]["text"].strip()
                    )
                    for q in records
                    if key in q["answers"] and baseline in q["answers"]
                ]
            )
            cell.update(_kl_summary([q["answers"][key].get("kl") for q in records]))
        out["cells"][key] = cell
    return out


def _cells(settings: dict[str, Any]) -> list[str]:
    ws, reference, rs = settings["ws"], settings.get("reference", ()), settings.get("rs", [0])
    return [f"{mode}@k{k}" for k in settings["ks"] for mode in modes(ws, reference, rs, k)]


def _kl_summary(kls: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    per_token = [v for kl in kls if kl for v in kl["per_token"]]
    if not per_token:
        return {}
    agree = [a for kl in kls if kl for a in kl["top1_agree"]]
    imputed = [v for kl in kls if kl for v in kl["p_mass_imputed"]]
    return {
        "kl_mean_per_token": statistics.fmean(per_token),
        "kl_median_per_token": statistics.median(per_token),
        "kl_p90_per_token": sorted(per_token)[int(0.9 * (len(per_token) - 1))],
        "kl_tokens": len(per_token),
        "top1_agreement": statistics.fmean(agree),
        "p_mass_imputed_mean": statistics.fmean(imputed),
        "kl_restarts": sum(kl["restarts"] for kl in kls if kl),
    }


def merge_runs(result: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``result`` on the questions both runs answered, with the cells only ``other`` has added
    (e.g. a ``--reference reorder`` run's, or an ``--r`` sweep's) and re-scored: one table for
    modes answered in two runs. The runs must share data, seed, k, answer length and
    logprobs; the prompt-injection answers they share are deterministic, and
    ``prompt_agreement`` says how many matched. Windows, r and reference modes are joined."""
    keys = ("data", "seed", "ks", "max_tokens", "logprobs")
    if any(result["settings"].get(k) != other["settings"].get(k) for k in keys):
        raise ValueError(f"the runs differ in one of {', '.join(keys)}")
    theirs = {q["id"]: q for q in other["questions"]}
    merged = {**result, "settings": dict(result["settings"]), "questions": []}
    same = shared = 0
    for q in result["questions"]:
        if q["id"] not in theirs:
            continue
        answers = dict(q["answers"])
        for cell, answer in theirs[q["id"]]["answers"].items():
            if cell in answers:
                shared += 1
                same += answers[cell]["text"] == answer["text"]
            else:
                answers[cell] = answer
        merged["questions"].append({**q, "answers": answers})
    for name, default in (("reference", []), ("ws", []), ("rs", [0])):
        joined = list(result["settings"].get(name, default))
        joined += [m for m in other["settings"].get(name, default) if m not in joined]
        merged["settings"][name] = sorted(joined) if name == "rs" else joined
    merged["merged_from"] = {
        "other_command": other.get("command"),
        "questions": len(merged["questions"]),
        "prompt_agreement": f"{same}/{shared}",
    }
    merged["scores"] = score(merged)
    return merged


def judge_answers(
    result: dict[str, Any],
    engine: Any,
    tokenizer: Any,
    judge_name: str,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Label every answer CORRECT/WRONG with a local judge model; re-score."""
    for i, q in enumerate(result["questions"]):
        on_progress(f"judging question {i + 1}/{len(result['questions'])}")
        for record in q["answers"].values():
            record["judged"] = judge(engine, tokenizer, q["question"], q["gold"], record["text"])
    result["judge"] = judge_name
    result["scores"] = score(result)
    return result


def headline(result: dict[str, Any]) -> str:
    settings, cells = result["settings"], result["scores"]["cells"]
    parts = []
    for k in settings["ks"]:
        names = modes(settings["ws"], settings.get("reference", ()), settings.get("rs", [0]), k)
        shown = [
            f"{_short(mode)} {cells[f'{mode}@k{k}']['f1'] or 0.0:.3f}"
            for mode in names
            if f"{mode}@k{k}" in cells
        ]
        parts.append(f"k={k}: " + ", ".join(shown))
    return f"{result['scores']['questions']} questions, F1 — " + "; ".join(parts)


def _short(mode: str) -> str:
    """``inject_w20a_r2`` -> ``w20a r2``; other modes as they are."""
    return mode.removeprefix("inject_").replace("_", " ")


def plot(result: dict[str, Any], path: Path) -> None:
    """F1 per k and mode (left) and mean KL per answer token (right); for a run with r > 0
    cells (an ``--r`` sweep), F1 and KL against r instead, one line per window and k."""
    settings, cells = result["settings"], result["scores"]["cells"]
    fig, (left, right) = figure(10, 4.2, ncols=2)
    if any(r > 0 for r in settings.get("rs", [0])):
        _plot_sweep(settings, cells, left, right)
    else:
        _plot_bars(settings, cells, left, right)
    left.set_ylabel("LoCoMo token F1 (categories 1-4)")
    left.set_title(f"{result['scores']['questions']} questions — {result['model']}")
    right.set_ylabel("mean KL(prompt ‖ injection) per answer token, nats")
    right.set_title(f"Next-token distributions (top-{settings['logprobs']} logprobs)")
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)


def _plot_bars(settings: dict[str, Any], cells: dict[str, Any], left: Any, right: Any) -> None:
    ks, names = settings["ks"], modes(settings["ws"], settings.get("reference", ()))
    width = 0.8 / len(names)
    for i, mode in enumerate(names):
        xs = [j + i * width for j in range(len(ks))]
        shown = [cells.get(f"{mode}@k{k}", {}) for k in ks]
        left.bar(xs, [cell.get("f1") or 0 for cell in shown], width, label=mode)
        if mode != "prompt":
            kl = [cell.get("kl_mean_per_token") or 0 for cell in shown]
            right.bar(xs, kl, width, label=mode, color=f"C{i}")
    for ax in (left, right):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], [f"k={k}" for k in ks])
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)


def _plot_sweep(settings: dict[str, Any], cells: dict[str, Any], left: Any, right: Any) -> None:
    """One colour per k, one line style per window; prompt injection's F1 (and a reference
    mode's KL) as a flat dotted line in the colour of its k."""
    styles = ["-", "--", "-."]  # dotted: the flat lines
    plotted: set[int] = set()
    for c, k in enumerate(settings["ks"]):
        for s, spec in enumerate(settings["ws"]):
            points = [
                (r, cells[f"{inject_mode(spec, r)}@k{k}"])
                for r in settings.get("rs", [0])
                if f"{inject_mode(spec, r)}@k{k}" in cells
            ]
            if not points:
                continue
            rs = [r for r, _ in points]
            plotted.update(rs)
            style = dict(color=f"C{c}", linestyle=styles[s % len(styles)], marker="o")
            label = f"w{spec}, k={k}"
            left.plot(rs, [cell.get("f1") or 0 for _, cell in points], **style, label=label)
            kl = [cell.get("kl_mean_per_token") or 0 for _, cell in points]
            right.plot(rs, kl, **style, label=label)
        prompt = cells.get(f"prompt@k{k}", {}).get("f1")
        if prompt is not None:
            left.axhline(prompt, color=f"C{c}", linestyle=":", alpha=0.6, label=f"prompt, k={k}")
        for mode in settings.get("reference", ()):
            kl = cells.get(f"{mode}@k{k}", {}).get("kl_mean_per_token")
            if kl is not None:
                right.axhline(kl, color=f"C{c}", linestyle=":", alpha=0.6, label=f"{mode}, k={k}")
    for ax in (left, right):
        ax.set_xticks(sorted(plotted))
        ax.set_xlabel("r, best facts prefilled instead of injected (r = k: prompt injection)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
