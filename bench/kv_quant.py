"""``bench kvquant``: what compressing the stored KV costs in fidelity, and what it saves.

The same LoCoMo facts (the product's retrieval, top ``max(ks)`` of each sampled question,
encoded through the engine after their context window, as the memory worker does) are
injected with every entry stored as the model computed it (``model``), then rewritten as each
compressed scheme (:mod:`inferscale_core.kvstore.quant`) under the same keys, and injected
again. Every fact is injected (no recompute), so the whole effect of compression shows.

Measured per scheme and k, against ``model`` in the same run and engine: mean next-token
KL(model ‖ scheme) per answer token along the model answer (teacher-forced where the answers
part, as ``bench locomo`` does), how often the argmaxes agree, how often the greedy answers are
identical, and LoCoMo's F1 of each against the gold answers (:mod:`bench.locomo_score`): the
scheme's F1, the model's with its 95% bootstrap interval, whether the first lies inside it, and
the paired difference's interval (questions resampled). Per scheme: the stored bytes of an
entry (mean), a token, and the ratio to the model's, and the keys' error quantized post-RoPE
(as stored) against pre-RoPE. Each scheme's requests carry their own cache salt (the store's
dtype is in it), so vLLM's prefix cache never serves one scheme's blocks to another. Every
answer's text is kept (``answers``), so the F1 can be scored again.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench import kv_quant_variants as variants
from bench import locomo_data
from bench.arguments import window_of
from bench.locomo import Forcing
from bench.locomo_score import bootstrap_ci, f1_score, locomo_f1, mean, mean_difference
from bench.report import provenance, write_json
from inferscale_core.kvstore import KVStore
from inferscale_core.kvstore.quant import dequantize, quantize
from inferscale_core.prompt_builder import PromptBuilder
from inferscale_core.rope import RopeSpec, shift
from inferscale_core.types import FactKV


def run_kv_quant(
    builder: PromptBuilder,
    engine: Any,
    store: KVStore,
    data: Path | str,
    *,
    sample: int | None = 40,
    seed: int = 0,
    ks: Sequence[int] = (5, 20, 50),
    w: int | str = "20a",
    schemes: Sequence[str] = ("fp8", "int4"),
    max_tokens: int = 16,
    logprobs: int = 20,
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda _: None,
    rope: RopeSpec | None = None,
    retrieval: Path | str | None = None,
    json_path: Path | None = None,
) -> dict[str, Any]:
    """Fidelity and size of each compressed scheme against the model's own KV (see module);
    with the model's ``rope``, also :func:`key_rope_error` over the same entries.

    ``retrieval``: a ``bench locomo --export-retrieval`` file whose hits are injected instead
    of retrieving with MiniLM (a machine without it: ``bench/gpu_kvquant.py``). ``json_path``:
    the result is written there after every cell too (``"unfinished": true`` until the end),
    so a run cut short keeps what it measured."""
    chosen = locomo_data.sample_questions(
        locomo_data.questions(locomo_data.load(data)), sample, seed
    )
    f1_score("ready", "ready")  # the F1's stemmer (nltk) is there before anything is encoded
    window_w, window = window_of(w)
    settings = {"sample": sample, "seed": seed, "ks": list(ks), "w": str(w)}
    settings["schemes"] = list(schemes)
    run: dict[str, Any] = {
        **provenance("kvquant", model_name, command),
        "settings": settings,
        "questions": len(chosen),
    }
    # every answer's text, per cell (``model@k5``, ``int4@k5``, …): the F1 can be scored again
    answers = {q.id: {"category": q.category, "gold": q.answer} for q in chosen}
    if retrieval is not None:
        run["hits_read_from"] = Path(retrieval).name
    written = store.store_dtype
    store.store_dtype = "model"
    originals: dict[str, FactKV] = {}
    try:
        with locomo_data.temporary_memory(data, chosen) as memory:
            if retrieval is not None:
                on_progress(f"reading the hits from {retrieval}")
                hits = locomo_data.load_retrieval(Path(retrieval), memory, chosen, max(ks))
            else:
                on_progress("retrieving…")
                embedder = locomo_data.default_embedder()
                hits = locomo_data.retrieve(memory, embedder, chosen, max(ks))
            facts = {
                q.id: [memory.memory_fact(h.fact, window_w, window) for h in hits[q.id]]
                for q in chosen
            }
        unique = list({f: None for q in chosen for f in facts[q.id]})
        for start in range(0, len(unique), 64):
            on_progress(f"encoding facts {start + 1}-{start + 64} of {len(unique)}")
            builder.encode_many(unique[start : start + 64])
        keys = sorted({key for key, _ in builder.encode_many(unique)})
        # An entry an earlier run left compressed is no baseline: those facts are encoded anew.
        stale = {key for key in keys if store.stored_scheme(key) != "model"}
        if stale:
            on_progress(f"encoding {len(stale)} facts anew in the model's dtype")
            pairs = zip(unique, builder.encode_many(unique), strict=True)
            builder.encode_many([f for f, (key, _) in pairs if key in stale], again=True)
            deadline = time.monotonic() + 60  # the old files stand until the new are written
            while any(store.stored_scheme(key) != "model" for key in stale):
                if time.monotonic() > deadline:
                    raise RuntimeError("entries encoded anew were not written within 60 s")
                time.sleep(0.05)
        originals = {key: _owned(store.get(key)) for key in keys}
        assert all(entry.quant is None for entry in originals.values())
        on_progress(f"{len(keys)} entries for {len(chosen)} questions")
        stored = [scheme for scheme in schemes if not variants.is_variant(scheme)]
        key_errors = key_rope_error(list(originals.values()), rope, stored) if rope else None
        cells: dict[str, dict[str, Any]] = {}
        sizes: dict[str, dict[str, float]] = {}
        run.update(entries=len(keys), sizes=sizes, cells=cells, key_error=key_errors)
        run["answers"] = answers
        baseline: dict[tuple[str, int], Any] = {}
        for scheme in ("model", *schemes):
            on_progress(f"{scheme}: writing {len(keys)} entries")
            simulated = variants.is_variant(scheme)
            for key in keys:
                if simulated:  # plain entries holding what the variant gives back
                    store.put(variants.round_trip(originals[key], scheme, rope), scheme="model")
                else:
                    store.put(quantize(originals[key], scheme), scheme=scheme)
            # the scheme is in the cache salt (a variant's in its scope): blocks of its own
            store.store_dtype = "model" if simulated else scheme
            asked = builder.scoped(scheme) if simulated else builder
            if not simulated:
                sizes[scheme] = _sizes(store, keys)
            for k in ks:
                on_progress(f"{scheme}: answering {len(chosen)} questions at k={k}")
                prompts = {
                    q.id: asked.build(facts[q.id][-k:], _question(q), w=window_w, window=window)
                    for q in chosen
                }
                gen = {"max_tokens": max_tokens, "logprobs": logprobs, "temperature": 0.0}
                results = engine.generate_batch(list(prompts.values()), **gen)
                for result in results:
                    if result.refused:
                        raise RuntimeError(f"{scheme} k={k}: injection refused: {result.refused}")
                for q, result in zip(chosen, results, strict=True):
                    answers[q.id][f"{scheme}@k{k}"] = result.text
                if scheme == "model":
                    baseline.update({(q.id, k): r for q, r in zip(chosen, results, strict=True)})
                    continue
                cells[f"{scheme}@k{k}"] = {
                    **_compare(engine, prompts, chosen, results, baseline, k, gen),
                    **f1_against_model(chosen, answers, f"{scheme}@k{k}", f"model@k{k}"),
                }
                on_progress(f"{scheme}@k{k}: {_cell_line(cells[f'{scheme}@k{k}'])}")
                if json_path is not None:
                    write_json({**_ratios(run), "unfinished": True}, json_path)
    finally:
        store.store_dtype = written
        if originals:  # the baseline as it was found: a later run encodes none of it anew
            on_progress(f"writing {len(originals)} entries back in the model's dtype")
            for entry in originals.values():
                store.put(entry, scheme="model")
    run = _ratios(run)
    if json_path is not None:
        write_json(run, json_path)
    return run


def _ratios(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with every measured scheme's size as a ratio to the model's."""
    model_bytes = result["sizes"]["model"]["bytes_per_entry"]
    for size in result["sizes"].values():
        size["smaller_than_model"] = round(model_bytes / size["bytes_per_entry"], 3)
    return result


def _cell_line(cell: dict[str, Any]) -> str:
    kl, top1 = cell["kl_mean_per_token"], cell["top1_agree"]
    low, high = cell["f1_model_ci95"] or (None, None)
    return (
        f"KL {kl if kl is None else f'{kl:.4f}'}, top-1 {top1 if top1 is None else f'{top1:.1%}'},"
        f" same answer {cell['same_answer']:.0%}, F1 {_number(cell['f1'])} (model"
        f" {_number(cell['f1_model'])}, CI {_number(low)}-{_number(high)})"
    )


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def f1_against_model(
    chosen: Sequence[locomo_data.Question],
    answers: dict[str, dict[str, Any]],
    cell: str,
    model_cell: str,
) -> dict[str, Any]:
    """LoCoMo's F1 of ``cell``'s answers and of ``model_cell``'s on the same questions: both
    means, the model's 95% bootstrap interval and whether ``cell``'s mean lies inside it, and
    the interval of the paired difference ``cell - model`` (0 inside it: no difference shown)."""
    pairs = [
        (
            locomo_f1(q.category, answers[q.id][cell], q.answer),
            locomo_f1(q.category, answers[q.id][model_cell], q.answer),
        )
        for q in chosen
    ]
    f1, f1_model = mean([a for a, _ in pairs]), mean([b for _, b in pairs])
    model_ci = bootstrap_ci([b for _, b in pairs], mean)
    return {
        "f1": _rounded(f1),
        "f1_model": _rounded(f1_model),
        "f1_model_ci95": _rounded_pair(model_ci),
        "f1_within_ci": (
            None if f1 is None or model_ci is None else model_ci[0] <= f1 <= model_ci[1]
        ),
        "f1_difference_ci95": _rounded_pair(bootstrap_ci(pairs, mean_difference)),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _rounded_pair(values: list[float] | None) -> list[float] | None:
    return None if values is None else [round(v, 4) for v in values]


def key_rope_error(
    entries: Sequence[FactKV], spec: RopeSpec, schemes: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Which keys to quantize, measured: relative error ``sum |k' - k|^2 / sum |k|^2`` of the
    keys every scheme gives back when it quantizes them as stored (post-RoPE, rotated at the
    entry's positions) against pre-RoPE (rotated back to position 0 first, rotated again after
    expanding, as KVQuant does), over all ``entries``, in fp32."""
    errors = {scheme: {"post_rope": 0.0, "pre_rope": 0.0} for scheme in schemes}
    norm = 0.0
    for entry in entries:
        k = entry.k.float()  # [layers, tokens, kv_heads, head_dim]
        at = torch.arange(k.shape[1], dtype=torch.int64) + entry.origin
        pre = shift(k, -at, spec)  # the keys before RoPE
        norm += float((k * k).sum())
        unrotated = FactKV(entry.key, list(entry.token_ids), pre, entry.v.float(), "", 0)
        for scheme in schemes:
            post_k = dequantize(quantize(entry, scheme), torch.float32).k
            pre_k = shift(dequantize(quantize(unrotated, scheme), torch.float32).k, at, spec)
            errors[scheme]["post_rope"] += float(((post_k - k) ** 2).sum())
            errors[scheme]["pre_rope"] += float(((pre_k - k) ** 2).sum())
    return {
        scheme: {name: round(total / norm, 8) for name, total in cell.items()}
        for scheme, cell in errors.items()
    }


def _question(q: locomo_data.Question) -> str:
    from bench.locomo import user_text

    return user_text(q)


def _compare(
    engine: Any,
    prompts: dict[str, Any],
    chosen: Sequence[locomo_data.Question],
    results: Sequence[Any],
    baseline: dict[tuple[str, int], Any],
    k: int,
    gen: dict[str, Any],
) -> dict[str, Any]:
    """KL and agreement of one scheme's answers at ``k`` with the model's."""
    forcing = {}
    for q, result in zip(chosen, results, strict=True):
        forcing[q.id] = Forcing(prompts[q.id], baseline[(q.id, k)].token_ids)
        forcing[q.id].feed(result)
    while pending := {key: f.next_prompt() for key, f in forcing.items() if f.next_prompt()}:
        longest = max(len(f.target) - len(f.steps) for f in forcing.values())
        batch = engine.generate_batch(list(pending.values()), **{**gen, "max_tokens": longest})
        for key, result in zip(pending, batch, strict=True):
            forcing[key].feed(result)
    kls, agree = [], []
    for q in chosen:
        report = forcing[q.id].report(baseline[(q.id, k)])
        kls.extend(report["per_token"])
        agree.extend(report["top1_agree"])
    same = sum(
        baseline[(q.id, k)].token_ids == r.token_ids for q, r in zip(chosen, results, strict=True)
    )
    return {
        "kl_mean_per_token": round(statistics.fmean(kls), 6) if kls else None,
        "kl_p90": round(sorted(kls)[int(0.9 * (len(kls) - 1))], 6) if kls else None,
        "top1_agree": round(sum(agree) / len(agree), 4) if agree else None,
        "same_answer": round(same / len(chosen), 4),
        "tokens": len(kls),
    }


def _sizes(store: KVStore, keys: Sequence[str]) -> dict[str, float]:
    headers = [store.header(key) for key in keys]
    payload = sum(h.nbytes for h in headers)
    tokens = sum(len(h.token_ids) for h in headers)
    files = sum(store.path(key).stat().st_size for key in keys)
    return {
        "bytes_per_entry": round(payload / len(keys), 1),
        "bytes_per_token": round(payload / tokens, 1),
        "file_bytes_per_entry": round(files / len(keys), 1),
        "tokens_per_entry": round(tokens / len(keys), 1),
    }


def _owned(entry: FactKV) -> FactKV:
    """A copy of the entry's tensors (the store's own may be rewritten under it)."""
    from inferscale_core.kvstore.quant import map_tensors

    return map_tensors(entry, lambda t: t.clone())


def headline(result: dict[str, Any]) -> str:
    sizes, cells = result["sizes"], result["cells"]
    parts = []
    for scheme in result["settings"]["schemes"]:
        kl = [c["kl_mean_per_token"] for n, c in cells.items() if n.startswith(scheme + "@")]
        top1 = [c["top1_agree"] for n, c in cells.items() if n.startswith(scheme + "@")]
        within = [c.get("f1_within_ci") for n, c in cells.items() if n.startswith(scheme + "@")]
        size = sizes.get(scheme)
        parts.append(
            f"{scheme}: "
            + (f"{size['smaller_than_model']:.2f}x smaller," if size else "simulated,")
            + f" KL {min(kl):.4f}-{max(kl):.4f} nats, top-1 {min(top1):.1%}-{max(top1):.1%}"
            + (
                f", F1 within the model's CI at {sum(w is True for w in within)} of {len(within)} k"
                if any(w is not None for w in within)
                else ""
            )
        )
    return f"kvquant, {result['questions']} questions: " + "; ".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    """Mean KL per answer token (left) and top-1 agreement (right) per k, one bar per scheme."""
    from bench.report import figure, save_figure

    fig, (left, right) = figure(11, 4.2, ncols=2)
    ks = result["settings"]["ks"]
    schemes = result["settings"]["schemes"]
    width = 0.8 / len(schemes)
    for i, scheme in enumerate(schemes):
        cells = [result["cells"][f"{scheme}@k{k}"] for k in ks]
        xs = [j + i * width for j in range(len(ks))]
        size = result["sizes"].get(scheme)
        label = f"{scheme} ({size['smaller_than_model']:.1f}x smaller)" if size else scheme
        left.bar(xs, [c["kl_mean_per_token"] for c in cells], width, label=label)
        right.bar(xs, [c["top1_agree"] for c in cells], width, label=label)
    axes = ((left, "mean KL(model ‖ scheme) per answer token, nats"), (right, "top-1 agreement"))
    for ax, name in axes:
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], [f"k={k}" for k in ks])
        ax.set_ylabel(name)
        ax.legend()
    fig.suptitle(f"Compressed KV entries, {result['questions']} LoCoMo questions")
    save_figure(fig, path)
