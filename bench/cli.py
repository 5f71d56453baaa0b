"""``inferscale-assistant bench …``: the benchmarks, each a module of ``bench``.

Every bench prints its table and, when asked, writes the raw samples as JSON (``--json``), a
PNG plot (``--plot``) and a dated row with the exact command in a Markdown run log (``--md``,
e.g. ``docs/BENCHMARKS.md``). Benches keep their KV entries in ``<data dir>/bench-kv``, apart
from the user's memories. The latency benches (ttft, throughput, tiers) run on the real model,
or with ``--dummy-config`` on dummy weights of any shape (a config.json; random ids and KV).
``bench retrieval``, ``bench recall``, ``bench updates`` and ``bench fusion`` need no engine:
MiniLM, the indexes and the fact log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from app.user_config import load_config
from bench.arguments import parse_ks, parse_names, parse_windows
from inferscale_core.config import AppConfig

if TYPE_CHECKING:  # the engine's imports (torch) only when a bench runs
    from inferscale_core import wiring

BENCH_STORE = "bench-kv"


# ---- set-up shared by the benches ----
def _quiet(verbose: bool) -> None:
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        logging.getLogger("vllm").setLevel(logging.ERROR)


def _config(args: argparse.Namespace, console: Console) -> AppConfig:
    """The user's settings, with ``--model`` (and ``--gpu-pool-gib``) from the command line."""
    config = load_config(console)
    if config is None:
        raise SystemExit(2)
    if args.model:
        config.model = args.model
    config.gpu_pool_gib = getattr(args, "gpu_pool_gib", 0) or 0
    if getattr(args, "kv_store_dtype", None):
        config.kv_store_dtype = args.kv_store_dtype
    return config


def _open_runtime(args: argparse.Namespace, console: Console) -> wiring.Assistant:
    """The real model's assistant, with the benches' own KV store."""
    from inferscale_core import paths, wiring

    _quiet(args.verbose)
    config = _config(args, console)
    with console.status("preparing the model…") as status:
        return wiring.build(
            config,
            store_root=paths.data_dir() / BENCH_STORE,
            on_step=lambda step: status.update(step + "…"),
            max_num_batched_tokens=getattr(args, "step_tokens", None),
        )


@contextlib.contextmanager
def _latency_setup(
    args: argparse.Namespace, console: Console, pool_size: int
) -> Iterator[tuple[Any, Any, Any, str]]:
    """``(prompt source, engine, store, model name)`` on the real model or dummy weights."""
    if args.dummy_config:
        from bench.dummy import (
            DummyPrompts,
            open_dummy_runtime,
            resolve_dummy_config,
        )

        _quiet(args.verbose)
        gpu_bytes = int((getattr(args, "gpu_pool_gib", 0) or 0) * (1 << 30))
        with tempfile.TemporaryDirectory(prefix="inferscale-dummy-") as tmp:
            model_dir = resolve_dummy_config(args.dummy_config, Path(tmp))
            with console.status(f"starting the engine on dummy weights ({model_dir.name})…"):
                runtime = open_dummy_runtime(
                    model_dir,
                    Path(tmp) / "kv",
                    gpu_bytes=gpu_bytes,
                    max_num_batched_tokens=args.step_tokens,
                )
            with console.status(f"writing {pool_size} random KV entries…"):
                source = DummyPrompts(runtime, pool_size, seed=args.seed)
            yield source, runtime.engine, runtime.store, runtime.model_name
        return
    from bench.prompts import FactPrompts

    runtime = _open_runtime(args, console)
    with console.status(f"encoding {pool_size} synthetic facts…"):
        source = FactPrompts(runtime.builder, pool_size, seed=args.seed)
    yield source, runtime.engine, runtime.store, runtime.model_dir.name


def _finish(
    result: dict[str, Any], args: argparse.Namespace, console: Console, bench: ModuleType
) -> int:
    from bench.report import append_run, write_json

    line = bench.headline(result)
    Console().print(line)
    if args.json:
        write_json(result, args.json)
        console.print(f"[dim]wrote {args.json}[/dim]")
    if args.plot:
        bench.plot(result, args.plot)
        console.print(f"[dim]wrote {args.plot}[/dim]")
    if args.md:
        append_run(args.md, result, line)
        console.print(f"[dim]appended a row to {args.md}[/dim]")
    return 0


def _table(title: str, rows: Sequence[dict[str, Any]], columns: dict[str, Callable]) -> None:
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(fn(row) for fn in columns.values()))
    Console().print(table)


def _ms(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: "" if row.get(key) is None else f"{row[key] * 1e3:.0f} ms"


# ---- the benches ----
def _run_ttft(args: argparse.Namespace, console: Console) -> int:
    from bench import ttft
    from bench.prompts import pool_size_for
    from bench.report import command_line

    ks = _ks(args, args.k)
    recompute = _ks(args, args.recompute, "--recompute")
    if args.runs < 1:
        args.parser.error("--runs must be at least 1")
    setup = _latency_setup(args, console, pool_size_for(ks))
    with setup as (source, engine, _, name), console.status("benchmarking…") as status:
        result = ttft.run_ttft(
            source,
            engine,
            ks,
            args.runs,
            warmup=args.warmup,
            seed=args.seed,
            recompute=recompute,
            model_name=name,
            command=command_line(),
            on_progress=status.update,
        )
    _table(
        f"TTFT on {result['model']} ({args.runs} runs per cell)",
        result["rows"],
        {
            "k": lambda r: str(r["k"]),
            "mode": lambda r: r["mode"],
            "median": _ms("ttft_s_median"),
            "p90": _ms("ttft_s_p90"),
            "prompt tok": lambda r: str(r["prompt_tokens"]),
            "computed": lambda r: str(r["computed_tokens"]),
            "injected": lambda r: str(r["injected_tokens"]),
        },
    )
    for key, value in result["ratios"].items():
        Console().print(f"{key}: {value:.2f}")
    return _finish(result, args, console, ttft)


def _run_throughput(args: argparse.Namespace, console: Console) -> int:
    from bench import throughput
    from bench.report import command_line

    users = [n for n in _ks(args, args.users, "--users") if n > 0]
    if not users or args.runs < 1:
        args.parser.error("--users needs a positive number and --runs at least 1")
    pool = max(2 * args.k, 10)
    setup = _latency_setup(args, console, pool)
    with setup as (source, engine, _, name), console.status("benchmarking…") as status:
        result = throughput.run_throughput(
            source,
            engine,
            users,
            args.k,
            args.runs,
            max_tokens=args.max_tokens,
            warmup=args.warmup,
            seed=args.seed,
            model_name=name,
            command=command_line(),
            on_progress=status.update,
        )
    _table(
        f"Throughput on {result['model']}, k={args.k} ({args.runs} runs per cell)",
        result["rows"],
        {
            "users": lambda r: str(r["users"]),
            "mode": lambda r: r["mode"],
            "req/s": lambda r: f"{r['requests_per_s']:.2f}",
            "TTFT p50": _ms("ttft_s_p50"),
            "TTFT p90": _ms("ttft_s_p90"),
            "out tok/s": lambda r: f"{r['output_tokens_per_s']:.1f}",
        },
    )
    return _finish(result, args, console, throughput)


def _run_tiers(args: argparse.Namespace, console: Console) -> int:
    from bench import tiers
    from bench.report import command_line

    chosen = [t for t in args.tiers.split(",") if t] if args.tiers else None
    unknown = set(chosen or ()) - set(tiers.TIERS)
    if unknown or args.runs < 1:
        args.parser.error(f"--tiers takes {','.join(tiers.TIERS)}; --runs at least 1")
    setup = _latency_setup(args, console, max(2 * args.k, 10))
    with setup as (source, engine, store, name), console.status("benchmarking…") as status:
        result = tiers.run_tiers(
            source,
            engine,
            store,
            args.k,
            args.runs,
            tiers=chosen,
            warmup=args.warmup,
            seed=args.seed,
            model_name=name,
            command=command_line(),
            on_progress=status.update,
        )
    _table(
        f"Injection from each tier on {result['model']}, k={args.k}",
        result["rows"],
        {
            "tier": lambda r: r["tier"],
            "MB": lambda r: f"{r['bytes'] / 1e6:.1f}",
            "TTFT": _ms("ttft_s_median"),
            "load": lambda r: f"{r.get('load_ms_median', 0):.1f} ms",
            "link GB/s": lambda r: f"{r['link_gb_s'] or 0:.1f} ({r['link']})",
            "floor": lambda r: f"{r['floor_ms'] or 0:.1f} ms",
        },
    )
    Console().print(result["page_cache_note"])
    return _finish(result, args, console, tiers)


def _run_encode(args: argparse.Namespace, console: Console) -> int:
    from bench import encode
    from bench.report import command_line

    ws = _windows(args, args.w)
    data = _data(args)  # before the engine starts: a missing file fails at once
    runtime = _open_runtime(args, console)
    with console.status("benchmarking…") as status:
        result = encode.run_encode(
            runtime.builder,
            data,
            ws,
            limit=args.limit,
            seed=args.seed,
            model_name=runtime.model_dir.name,
            command=command_line(),
            on_progress=status.update,
        )
    _table(
        f"Encoding LoCoMo facts on {result['model']}",
        result["rows"],
        {
            "w": lambda r: str(r.get("spec", r["w"])),
            "facts": lambda r: str(r["facts"]),
            "facts/s": lambda r: f"{r['facts_per_s']:.2f}",
            "tokens/s": lambda r: f"{r['tokens_per_s']:.0f}",
            f"all {result['rows'][0]['all_facts']}": lambda r: (
                f"{r['all_seconds'] / 60:.1f} min"
                + (" (extrapolated)" if r["all_extrapolated"] else "")
            ),
        },
    )
    return _finish(result, args, console, encode)


def _run_retrieval(args: argparse.Namespace, console: Console) -> int:
    from bench import retrieval
    from bench.report import command_line

    sizes = [n for n in _ks(args, args.sizes, "--sizes") if n > 0]
    if not sizes or args.k < 1 or args.queries < 1:
        args.parser.error("--sizes needs a positive number, --k and --queries at least 1")
    if min(sizes) < args.k:
        args.parser.error(f"every --sizes value must be at least --k ({args.k})")
    if args.vectors and args.export_vectors:
        args.parser.error("--vectors reads exported vectors; --export-vectors writes them: one")
    device = retrieval.resolve_device(args.device)
    encoder = None
    if args.vectors:
        vectors = retrieval.load_vectors(args.vectors)
    else:
        from inferscale_core.embedder import SentenceTransformerEmbedder

        data = _data(args)  # before MiniLM loads: a missing file fails at once
        embedder = SentenceTransformerEmbedder(device=str(device))
        if args.export_vectors:
            with console.status("embedding all of LoCoMo's texts and questions…"):
                info = retrieval.export_vectors(
                    args.export_vectors, data, embedder, embedder.model_dir, args.seed
                )
            console.print(
                f"wrote {info['vectors']} ({info['corpus_rows']} texts, {info['queries']}"
                f" questions, {info['vectors_bytes'] / 1e6:.1f} MB) and"
                f" {info['minilm_config']}/ ({info['minilm_config_bytes'] / 1e6:.2f} MB:"
                " MiniLM's config and tokenizer, no weights)"
            )
            return 0
        with console.status("embedding LoCoMo's texts and questions…"):
            vectors = retrieval.locomo_vectors(
                data, embedder, texts=args.texts, questions=args.queries, seed=args.seed
            )
        encoder = retrieval.QueryEncoder(
            lambda text: embedder.embed([text]),
            f"SentenceTransformerEmbedder ({embedder.name}) on {device}",
            "trained",
        )
    with console.status("benchmarking…") as status:
        result = retrieval.run_retrieval(
            vectors,
            sizes,
            k=args.k,
            queries=args.queries,
            device=device,
            encoder=encoder,
            noise=args.noise,
            seed=args.seed,
            command=command_line(),
            on_progress=status.update,
        )
    _table(
        f"Top-{result['k']} search (one question per call) on {result['device_name']},"
        f" {result['queries']} questions",
        result["rows"],
        {
            "N": lambda r: f"{r['n']:,}",
            "index": lambda r: r["index"],
            "build": lambda r: f"{r['build_s']:.2f} s",
            "extend": lambda r: "" if r["extend_s"] is None else f"{r['extend_s'] * 1e3:.1f} ms",
            "p50": lambda r: f"{r['search_s_median'] * 1e3:.2f} ms",
            "p90": lambda r: f"{r['search_s_p90'] * 1e3:.2f} ms",
            "batch q/s": lambda r: f"{r['batch_queries_per_s']:,.0f}",
            "recall": lambda r: f"{r['recall_at_k']:.3f}",
            "+embed p50": lambda r: (
                ""
                if r.get("embed_plus_search_s_median") is None
                else f"{r['embed_plus_search_s_median'] * 1e3:.1f} ms"
            ),
        },
    )
    for what, why in result["skipped"].items():
        Console().print(f"{what} skipped: {why}")
    for cell, why in result["failed"].items():
        Console().print(f"[red]{cell} failed: {why}[/red]")
    return _finish(result, args, console, retrieval)


def _run_recall(args: argparse.Namespace, console: Console) -> int:
    from bench import recall
    from bench.report import command_line
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.retriever import MODES

    ks = _ks(args, args.k)
    modes = parse_names(args.modes)
    if min(ks) < 1 or not modes or set(modes) - set(MODES):
        args.parser.error(f"--k needs numbers >= 1, --modes some of {', '.join(MODES)}")
    if args.latency_facts < 0 or args.latency_queries < 1 or args.latency_idle_ms < 0:
        args.parser.error(
            "--latency-facts and --latency-idle-ms need numbers >= 0, --latency-queries >= 1"
        )
    if args.latency_vs is not None:
        if not (args.latency_vs / "inferscale_core" / "retriever.py").is_file():
            args.parser.error(
                f"--latency-vs needs another checkout's root (e.g. `git worktree add"
                f" ../base <commit>`); {args.latency_vs} has no inferscale_core/retriever.py"
            )
        if args.latency_blocks < 2 or args.latency_queries <= 10:
            args.parser.error("--latency-vs needs --latency-blocks >= 2, --latency-queries > 10")
    data = _data(args)  # before MiniLM loads: a missing file fails at once
    with console.status("benchmarking…") as status:
        result = recall.run_recall(
            data,
            SentenceTransformerEmbedder(),
            ks=ks,
            modes=modes,
            sample_ids=parse_names(args.samples) or None,
            latency_facts=args.latency_facts,
            latency_queries=args.latency_queries,
            latency_ks=_ks(args, args.latency_k, "--latency-k")
            if args.latency_k
            else recall.LATENCY_KS,
            latency_idle_ms=args.latency_idle_ms,
            latency_vs=args.latency_vs,
            latency_blocks=args.latency_blocks,
            seed=args.seed,
            command=command_line(),
            on_progress=status.update,
        )
    Console().print(recall.markdown(result), markup=False, highlight=False, soft_wrap=True)
    return _finish(result, args, console, recall)


def _run_updates(args: argparse.Namespace, console: Console) -> int:
    from bench import life_set, updates
    from bench.report import command_line
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.retriever import MODES

    ks = _ks(args, args.k)
    modes = parse_names(args.modes)
    if min(ks) < 1 or not modes or set(modes) - set(MODES):
        args.parser.error(f"--k needs numbers >= 1, --modes some of {', '.join(MODES)}")
    try:  # before MiniLM loads: a missing or broken set fails at once
        life = life_set.load(args.data or life_set.DEFAULT)
    except (OSError, ValueError) as exc:
        args.parser.error(str(exc))
    with console.status("benchmarking…") as status:
        result = updates.run_updates(
            life,
            SentenceTransformerEmbedder(),
            ks=ks,
            modes=modes,
            command=command_line(),
            on_progress=status.update,
        )
    Console().print(updates.markdown(result), markup=False, highlight=False, soft_wrap=True)
    return _finish(result, args, console, updates)


def _run_fusion(args: argparse.Namespace, console: Console) -> int:
    from bench import fusion, life_set
    from bench.locomo_data import load
    from bench.report import command_line
    from inferscale_core.embedder import SentenceTransformerEmbedder

    data = _data(args)  # before MiniLM loads: a missing or unsplittable file fails at once
    try:
        grid = fusion.parse_grid(args.grid)
        fusion.split(load(data), args.tune)
        life = life_set.load(args.life or life_set.DEFAULT)
    except (OSError, ValueError) as exc:
        args.parser.error(str(exc))
    with console.status("benchmarking…") as status:
        result = fusion.run_fusion(
            life,
            SentenceTransformerEmbedder(),
            data,
            grid=grid,
            tune_samples=args.tune,
            command=command_line(),
            on_progress=status.update,
        )
    Console().print(fusion.markdown(result), markup=False, highlight=False, soft_wrap=True)
    return _finish(result, args, console, fusion)


def _run_locomo(args: argparse.Namespace, console: Console) -> int:
    from bench import locomo
    from bench.report import command_line

    if args.rescore:
        return _rescore(args, console)
    if args.merge or args.judge:
        args.parser.error("--merge and --judge work on a saved run: add --rescore RUN.json")
    ks = _ks(args, args.k)
    ws = [] if args.w.strip().lower() == "none" else _windows(args, args.w)
    rs = _ks(args, args.r, "--r")
    if min(ks) < 1:
        args.parser.error("--k needs numbers >= 1")
    reference = parse_names(args.reference)
    data = _data(args)  # before MiniLM or the engine starts: a missing file fails at once
    unknown = set(reference) - set(locomo.REFERENCES)
    if unknown:
        args.parser.error(
            f"--reference takes {', '.join(locomo.REFERENCES)}; got {', '.join(sorted(unknown))}"
        )
    if args.export_retrieval:
        with console.status("retrieving…") as status:
            done = locomo.export_retrieval(
                data,
                args.export_retrieval,
                sample=args.sample,
                seed=args.seed,
                k=max(ks),
                on_progress=status.update,
            )
        console.print(
            f"wrote the top {done['k']} facts of {done['questions']} questions to {done['path']}"
        )
        return 0
    if args.retrieval and not args.retrieval.is_file():
        args.parser.error(f"--retrieval: no such file {args.retrieval}")
    resume = None
    if args.resume:
        if not args.json or not args.json.exists():
            args.parser.error("--resume needs the --json file of the run to continue")
        resume = json.loads(args.json.read_text())
    runtime = _open_runtime(args, console)
    with console.status("benchmarking…") as status:
        result = locomo.run_locomo(
            runtime.builder,
            runtime.engine,
            data,
            sample=args.sample,
            seed=args.seed,
            ks=ks,
            ws=ws,
            rs=rs,
            max_tokens=args.max_tokens,
            logprobs=args.logprobs,
            kl=not args.no_kl,
            reference=reference,
            batch=args.batch,
            json_path=args.json,
            resume=resume,
            model_name=runtime.model_dir.name,
            command=command_line(),
            retrieval=args.retrieval,
            on_progress=status.update,
        )
    _locomo_table(result)
    return _finish(result, args, console, locomo)


def _run_kv_quant(args: argparse.Namespace, console: Console) -> int:
    from bench import kv_quant
    from bench.report import command_line
    from inferscale_core.model_files import check_architecture

    ks = _ks(args, args.k)
    schemes = parse_names(args.schemes)
    from bench.kv_quant_variants import names

    unknown = set(schemes) - {"fp8", "int4", *names()}
    if unknown or not schemes:
        args.parser.error(
            f"--schemes takes fp8, int4 and the variants {', '.join(names())}; got {args.schemes!r}"
        )
    data = _data(args)
    runtime = _open_runtime(args, console)
    with console.status("benchmarking…") as status:
        result = kv_quant.run_kv_quant(
            runtime.builder,
            runtime.engine,
            runtime.store,
            data,
            sample=args.sample,
            seed=args.seed,
            ks=ks,
            w=_windows(args, args.w)[0],
            schemes=schemes,
            max_tokens=args.max_tokens,
            logprobs=args.logprobs,
            model_name=runtime.model_dir.name,
            command=command_line(),
            on_progress=status.update,
            rope=check_architecture(runtime.model_dir).shared_rope,
            retrieval=args.retrieval,
            json_path=args.json,  # after every cell too: a run cut short keeps what it measured
        )
    rows = [{"cell": name, **cell} for name, cell in result["cells"].items()]
    _table(
        "KV compression: KL(model ‖ scheme) and agreement",
        rows,
        {
            "cell": lambda r: r["cell"],
            "KL/token": lambda r: f"{r['kl_mean_per_token']:.4f}",
            "top-1": lambda r: f"{r['top1_agree']:.1%}",
            "same answer": lambda r: f"{r['same_answer']:.0%}",
            "F1": lambda r: f"{r['f1']:.3f}",
            "model F1 (95% CI)": lambda r: _f1_with_ci(r["f1_model"], r["f1_model_ci95"]),
            "F1 − model (95% CI)": lambda r: _interval(r["f1_difference_ci95"]),
        },
    )
    return _finish(result, args, console, kv_quant)


def _f1_with_ci(f1: float, ci: list[float] | None) -> str:
    return f"{f1:.3f} ({'n/a' if ci is None else f'{ci[0]:.3f}-{ci[1]:.3f}'})"


def _interval(ci: list[float] | None) -> str:
    return "n/a" if ci is None else f"{ci[0]:+.3f} to {ci[1]:+.3f}"


def _rescore(args: argparse.Namespace, console: Console) -> int:
    from bench import locomo
    from bench.report import command_line

    result = _read_run(args.rescore)
    result["scores"] = locomo.score(result)
    if args.merge:
        try:
            result = locomo.merge_runs(result, _read_run(args.merge))
        except ValueError as exc:
            args.parser.error(f"--merge: {exc}")
        info = result["merged_from"]
        console.print(
            f"{info['questions']} questions in both runs; shared answers identical:"
            f" {info['prompt_agreement']}"
        )
    result["rescored"] = command_line()
    if args.judge:
        from transformers import AutoTokenizer

        from inferscale_core import wiring

        _quiet(args.verbose)
        judge_dir = Path(args.judge)
        with tempfile.TemporaryDirectory() as tmp, console.status("starting the judge…") as status:
            engine = wiring.start_engine(judge_dir, wiring.open_store(judge_dir, Path(tmp)))
            tokenizer = AutoTokenizer.from_pretrained(str(judge_dir))
            locomo.judge_answers(result, engine, tokenizer, judge_dir.name, status.update)
    if not args.merge:  # a merged table is a view: written only where --json says
        args.json = args.json or args.rescore.with_suffix(
            "" if args.rescore.suffix == ".xz" else ".json"
        )
    _locomo_table(result)
    return _finish(result, args, console, locomo)


def _read_run(path: Path) -> dict[str, Any]:
    """A saved LoCoMo run: JSON, or JSON compressed with xz (``.xz``, as the GPU run returns it)."""
    if path.suffix == ".xz":
        import lzma

        return json.loads(lzma.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def _locomo_table(result: dict[str, Any]) -> None:
    from bench.locomo_data import CATEGORIES

    cells = result["scores"]["cells"]
    rows = [{"cell": key, **cell} for key, cell in cells.items()]

    def fmt(value: Any, digits: int = 3) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    columns: dict[str, Callable] = {
        "mode@k": lambda r: r["cell"],
        "F1": lambda r: fmt(r["f1"]),
        "/ prompt": lambda r: fmt(r.get("f1_over_prompt"), 2),
        "95% CI": lambda r: (
            ""
            if not r.get("f1_over_prompt_ci95")
            else "{:.2f}-{:.2f}".format(*r["f1_over_prompt_ci95"])
        ),
    }
    for name in CATEGORIES.values():
        columns[name] = lambda r, name=name: fmt(r["by_category"][name]["f1"])
    columns["KL/token"] = lambda r: fmt(r.get("kl_mean_per_token"), 4)
    columns["top-1 agree"] = lambda r: fmt(r.get("top1_agreement"), 3)
    columns["prefilled"] = lambda r: fmt(r.get("computed_tokens_median"), 0)
    if any("judged_accuracy" in r for r in rows):
        columns["judged"] = lambda r: fmt(r.get("judged_accuracy"))
    _table(f"LoCoMo, {result['scores']['questions']} questions — {result['model']}", rows, columns)


def _run_import(args: argparse.Namespace, console: Console) -> int:
    import shutil

    from bench import import_time
    from bench.import_time import duration
    from bench.report import command_line
    from inferscale_core import paths

    if args.turns < 2 or args.days < 1 or args.probes < 1 or args.encode_limit <= 0:
        args.parser.error("--turns >= 2, --days and --probes >= 1, --encode-limit > 0")
    # A fresh home (fact logs, inboxes, the KV store); the model cache stays the user's.
    os.environ.setdefault(paths.CACHE_ENV, str(paths.cache_dir()))
    work = Path(tempfile.mkdtemp(prefix="inferscale-import-"))
    os.environ[paths.HOME_ENV] = str(work / "home")
    try:
        runtime = _open_runtime(args, console)
        config = _config(args, console)
        with console.status("importing…") as status:
            result = import_time.run_import(
                runtime,
                config,
                work,
                turns=args.turns,
                days=args.days,
                probes=args.probes,
                limit=args.encode_limit,
                lazy_limit=args.lazy_limit,
                seed=args.seed,
                model_name=runtime.model_dir.name,
                command=command_line(),
                on_progress=_every(console, status.update, 30.0),
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _table(
        f"Import of {args.turns:,} turns on {result['model']}",
        result["rows"],
        {
            "mode": lambda r: r["mode"],
            "imported": lambda r: duration(r["imported_s"]),
            "usable": lambda r: duration(r["usable_s"], import_time.usable_extrapolated(r)),
            "fully encoded": lambda r: duration(r["fully_encoded_s"], r["extrapolated"]),
            "facts": lambda r: f"{r['facts']:,}",
            "deferred": lambda r: f"{r['deferred']:,}",
            "encoded": lambda r: f"{r['encoded']:,}",
            "disk": lambda r: f"{r['kv_disk_bytes'] / 1e6:.0f} MB",
            "facts/s": lambda r: f"{r['encode_rate_facts_per_s']:.2f}",
            "probes": lambda r: f"{r['probes_answered_from_memory']}/{len(r['probes'])}",
        },
    )
    return _finish(result, args, console, import_time)


def _every(console: Console, show: Callable[[str], None], seconds: float) -> Callable[[str], None]:
    """``show`` every line; print one every ``seconds`` (a long run leaves a trace)."""
    last = [0.0]

    import time

    def progress(line: str) -> None:
        show(line)
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            console.print(f"[dim]{line}[/dim]")

    return progress


def _data(args: argparse.Namespace) -> Path:
    from bench.locomo_data import LocomoDataMissingError, require

    try:
        return require(args.data)
    except LocomoDataMissingError as exc:
        args.parser.error(str(exc))
        raise  # unreachable: error() exits


def _windows(args: argparse.Namespace, text: str) -> list[int | str]:
    try:
        return parse_windows(text, "--w")
    except ValueError as exc:
        args.parser.error(str(exc))
        raise  # unreachable: error() exits


def _ks(args: argparse.Namespace, text: str, name: str = "--k") -> list[int]:
    try:
        return parse_ks(text, name)
    except ValueError as exc:
        args.parser.error(str(exc))
        raise  # unreachable: error() exits


# ---- the parsers ----
def _files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="write raw samples as JSON here")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG plot here")
    parser.add_argument(
        "--md",
        type=Path,
        metavar="PATH",
        help="append a dated row with this command to the run log of this Markdown file",
    )


def _outputs(parser: argparse.ArgumentParser) -> None:
    _files(parser)
    parser.add_argument("--model", help="local Hugging Face model folder (default: SmolLM2)")
    parser.add_argument(
        "--kv-store-dtype",
        choices=("model", "fp8", "int4"),
        help="how the bench's entries are stored (default: the settings' kv_store_dtype)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (0)")


def _latency(parser: argparse.ArgumentParser, runs: int, warmup: int) -> None:
    _outputs(parser)
    parser.add_argument(
        "--dummy-config",
        metavar="PATH",
        help="run on dummy weights: a config.json, a folder holding one, or a built-in shape"
        " (llama-3.1-8b, smollm2-135m, tiny-llama); requests are random ids and random KV",
    )
    parser.add_argument("--runs", type=int, default=runs, help=f"measured runs per cell ({runs})")
    parser.add_argument("--warmup", type=int, default=warmup, help=f"warm-up runs ({warmup})")
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=0,
        help="prompt tokens one engine step may compute (vLLM's max_num_batched_tokens). 0, the"
        " default: vLLM's own, as every earlier run, so prompt injection (the baseline) is not"
        " slowed by the product's small chat-latency steps (64 on a CPU); give 64 to measure"
        " those",
    )


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="measure: TTFT, throughput, KV tiers, encoding, retrieval, recall, LoCoMo accuracy",
    )
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)

    ttft = bench_sub.add_parser(
        "ttft",
        help="time to first token with k memories: injection, prompt injection, warm prompt",
        description="For each k, each run draws k synthetic facts (~50 tokens each) in a random"
        " order and measures TTFT of (a) KV injection, (b) prompt injection (prefix caching on)"
        " and (c) the same prompt sent again (prefix caching's best case) in the same engine.",
    )
    ttft.add_argument("--k", default="0,5,20,50", help="comma-separated numbers of facts")
    ttft.add_argument(
        "--recompute",
        default="0",
        metavar="RS",
        help="tail recompute: also time injection with the last r facts prefilled as text"
        " (mode inject_r<r>), e.g. 0,2,4; an r >= k is skipped at that k (0)",
    )
    _latency(ttft, runs=5, warmup=2)
    ttft.set_defaults(func=_run_ttft, parser=ttft)

    tp = bench_sub.add_parser(
        "throughput",
        help="N concurrent users, each with its own k memories: requests/s and TTFT",
        description="For each N, every run submits N requests at once (each user its own random"
        " set of k facts and question) with injection, then with prompt injection.",
    )
    tp.add_argument("--users", default="1,4,8", help="comma-separated user counts (1,4,8)")
    tp.add_argument("--k", type=int, default=50, help="memories per user (50)")
    tp.add_argument("--max-tokens", type=int, default=16, help="output tokens per request (16)")
    _latency(tp, runs=3, warmup=1)
    tp.set_defaults(func=_run_throughput, parser=tp)

    tiers = bench_sub.add_parser(
        "tiers",
        help="injection cost with the memories on each KV-store tier, against the copy floor",
        description="Per run and tier, k fresh facts are left on that tier only (GPU pool,"
        " pinned or plain host RAM, disk through the page cache, disk with its pages dropped)"
        " and one injected request is timed; the copy bandwidth of each link gives the floor.",
    )
    tiers.add_argument("--k", type=int, default=50, help="memories per request (50)")
    tiers.add_argument("--tiers", help="comma-separated subset (default: all available)")
    tiers.add_argument(
        "--gpu-pool-gib", type=float, default=1.0, help="GPU pool size on CUDA (1 GiB)"
    )
    _latency(tiers, runs=5, warmup=1)
    tiers.set_defaults(func=_run_tiers, parser=tiers)

    data_help = (
        "locomo10.json, CC BY-NC 4.0, not shipped (default: $INFERSCALE_LOCOMO, else"
        " ../shared/data/locomo/ beside the checkout)"
    )
    enc = bench_sub.add_parser(
        "encode",
        help="memory facts encoded per second for context windows; time for all of LoCoMo",
        description="Encodes LoCoMo's observation facts, each after its context turns, with"
        " the product's encoder; --limit encodes a seeded sample and extrapolates.",
    )
    enc.add_argument(
        "--w",
        default="0,5,20,20a",
        help="comma-separated context windows: 20 = the 20 turns before a fact (sliding),"
        " 20a = the anchored window of w=20 (0,5,20,20a)",
    )
    enc.add_argument("--limit", type=int, help="facts per w (default: all the file's)")
    enc.add_argument("--data", type=Path, help=data_help)
    _outputs(enc)
    enc.set_defaults(func=_run_encode, parser=enc)

    ret = bench_sub.add_parser(
        "retrieval",
        help="embed + top-k search time at N facts, exact vs CAGRA, and CAGRA's recall@k",
        description="Embeds LoCoMo's texts (observations + turns, ~8,400) and a seeded sample"
        " of its questions with MiniLM; for N beyond the real texts, rows are real vectors plus"
        " small Gaussian noise, renormalised (clustered like real text). For each N it times"
        " build, extend, one-query search (median, p90) and batched search of the exact index"
        " and of CAGRA (cuVS, CUDA only: reported skipped with the reason elsewhere), CAGRA's"
        " recall@k against exact search, and embedding one question on the same device.",
    )
    ret.add_argument(
        "--sizes", default="10000,100000", help="comma-separated corpus sizes N (10000,100000)"
    )
    ret.add_argument("--k", type=int, default=50, help="top-k per search (50)")
    ret.add_argument("--queries", type=int, default=200, help="LoCoMo questions, seeded (200)")
    ret.add_argument(
        "--device", default="auto", help="where embedder and indexes run: auto (CUDA if any), cpu"
    )
    ret.add_argument(
        "--texts",
        type=int,
        help="embed only this many LoCoMo texts as the real rows (all; not with --vectors)",
    )
    ret.add_argument(
        "--vectors",
        type=Path,
        metavar="NPZ",
        help="use vectors exported by --export-vectors (corpus [s, 384], queries [q, 384])"
        " instead of embedding LoCoMo",
    )
    ret.add_argument(
        "--export-vectors",
        type=Path,
        metavar="NPZ",
        help="only embed all of LoCoMo into this .npz, with MiniLM's config and tokenizer"
        " (no weights) in a .minilm folder beside it, for a GPU machine: see"
        " python -m bench.retrieval --help",
    )
    ret.add_argument(
        "--noise",
        type=float,
        default=0.5,
        help="expected norm of the noise added to a real vector for a synthetic one (0.5)",
    )
    ret.add_argument("--data", type=Path, help=data_help)
    ret.add_argument("--seed", type=int, default=0, help="sampling and noise seed (0)")
    _files(ret)
    ret.set_defaults(func=_run_retrieval, parser=ret)

    rec = bench_sub.add_parser(
        "recall",
        help="LoCoMo evidence recall@k of the retriever (hybrid, dense, keyword) per category",
        description="Imports LoCoMo (one profile per conversation) and extracts facts with the"
        " product's own extractor (the embedded model's, deterministic) as the memory worker"
        " does, then asks every question of categories 1-4 of Retriever.search in each mode"
        " at each k. A question is a hit at k when one of its top-k facts was extracted from"
        " one of its evidence turns (dia_id), so extraction losses count. Prints R@k per mode"
        " and category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) and overall as"
        " a Markdown table; --json keeps it all. Also times Retriever.search at"
        " --latency-facts facts (LoCoMo's facts in one profile, filled up with copies).",
    )
    rec.add_argument("--k", default="5,10,20,50", help="comma-separated k (5,10,20,50)")
    rec.add_argument(
        "--modes", default="hybrid,dense,keyword", help="retrieval modes (hybrid,dense,keyword)"
    )
    rec.add_argument(
        "--samples", default="", help="comma-separated LoCoMo sample ids (default: all ten)"
    )
    rec.add_argument(
        "--latency-facts",
        type=int,
        default=10_000,
        metavar="N",
        help="time one search per mode and question at N facts (10000); 0 skips it",
    )
    rec.add_argument(
        "--latency-queries", type=int, default=200, help="timed questions, seeded (200)"
    )
    rec.add_argument(
        "--latency-k",
        help="comma-separated k of the latency timing (default: 10 and the product's k)",
    )
    rec.add_argument(
        "--latency-idle-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="sleep before each timed call, as a chat turn's search starts after idle (default"
        " 0: back to back); on a small virtual machine the first call after idle wakes cores",
    )
    rec.add_argument(
        "--latency-vs",
        type=Path,
        metavar="TREE",
        help="time the searches against another checkout instead (its root, e.g. a `git"
        " worktree` of an older commit): both fill a profile at once in processes of their"
        " own, then time alternated blocks of 10 questions (A B, B A, ...) so the machine's"
        " drift falls on both; prints each checkout's p50 and the ratio",
    )
    rec.add_argument(
        "--latency-blocks",
        type=int,
        default=38,
        metavar="N",
        help="with --latency-vs: blocks each checkout times (38: every question twice)",
    )
    rec.add_argument("--data", type=Path, help=data_help)
    rec.add_argument("--seed", type=int, default=0, help="seed of the timed questions (0)")
    _files(rec)
    rec.set_defaults(func=_run_recall, parser=rec)

    upd = bench_sub.add_parser(
        "updates",
        help="the life set (issue 36): is what is true now retrieved first? R@k per mode",
        description="Imports the life set (bench/data/life.json: two years of one person's"
        " chats, attributes that change, dated events) into one profile, extracts its facts"
        " with the product's own extractor as the memory worker does, then asks its questions"
        " (update, past, month, paraphrase, people, single) of Retriever.search in each mode at"
        " each k, 'now' being when each was asked. Prints R@k per mode and category, how often"
        " the current value ranks above the replaced ones, how much of a month question's top"
        " 10 lies in its month, and how the extractor dated the labelled turns.",
    )
    upd.add_argument("--k", default="1,5,10", help="comma-separated k (1,5,10)")
    upd.add_argument(
        "--modes", default="hybrid,dense,keyword", help="retrieval modes (hybrid,dense,keyword)"
    )
    upd.add_argument(
        "--data", type=Path, metavar="PATH", help="the set (default: bench/data/life.json)"
    )
    _files(upd)
    upd.set_defaults(func=_run_updates, parser=upd)

    fus = bench_sub.add_parser(
        "fusion",
        help="the hybrid retriever's fusion constants chosen on a tuning split, held-out R@k",
        description="Sweeps the retriever's fusion constants (RRF_K, KEYWORD_WEIGHT, CANDIDATES,"
        " RECENCY_WEIGHT when it has one) over a grid on a tuning split (LoCoMo's first --tune"
        " samples in file order + the life set), chooses the point with the best objective"
        " (mean R@10 of the two, a penalty per category where hybrid trails dense by more"
        " than 0.02; see bench/fusion.py), then reports LoCoMo's other samples (held out) with"
        " today's constants, the chosen ones and dense. Restores the constants afterwards.",
    )
    fus.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V,V",
        help="replace one axis of the grid, e.g. --grid RRF_K=2,5 (repeatable; default"
        " RRF_K=2,5,10,30 KEYWORD_WEIGHT=0.5,1,1.5,2,3 CANDIDATES=2,4 RECENCY_WEIGHT=0,1,2)",
    )
    fus.add_argument(
        "--tune", type=int, default=5, help="LoCoMo's first N samples tune; the rest are held out"
    )
    fus.add_argument("--data", type=Path, help=data_help)
    fus.add_argument(
        "--life", type=Path, metavar="PATH", help="the life set (default: bench/data/life.json)"
    )
    _files(fus)
    fus.set_defaults(func=_run_fusion, parser=fus)

    kvq = bench_sub.add_parser(
        "kvquant",
        help="compressed KV entries (fp8, int4): next-token KL and size against the model's",
        description="Injects the same retrieved LoCoMo facts with every entry stored as the"
        " model computed it, then as each compressed scheme, and compares the answers' next-token"
        " distributions (KL, top-1 agreement) and the bytes an entry takes.",
    )
    kvq.add_argument("--sample", type=int, default=40, help="questions, seeded (40)")
    kvq.add_argument("--k", default="5,20,50", help="comma-separated numbers of facts")
    kvq.add_argument("--w", default="20a", help="the facts' context window (20a: anchored)")
    kvq.add_argument(
        "--schemes",
        default="fp8,int4",
        help="compressed schemes (fp8,int4), and int4's variants simulated by a round trip:"
        " sim-int4, sim-int4-k4, sim-int4-minmax, sim-int4-k, sim-int4-v, sim-int4-pre"
        " (bench/kv_quant_variants.py)",
    )
    kvq.add_argument("--max-tokens", type=int, default=16, help="answer length limit (16)")
    kvq.add_argument("--logprobs", type=int, default=20, help="top logprobs for the KL (20)")
    kvq.add_argument("--data", type=Path, help=data_help)
    kvq.add_argument(
        "--retrieval",
        type=Path,
        metavar="FILE",
        help="inject the facts in FILE (bench locomo --export-retrieval) instead of retrieving",
    )
    _outputs(kvq)
    kvq.set_defaults(func=_run_kv_quant, parser=kvq)

    imp = bench_sub.add_parser(
        "import",
        help="a 10k-turn chat export dropped into the inbox: time until usable, fully encoded",
        description="Writes a seeded JSON Lines export (two people, dated turns over --days,"
        " one unique fact a turn), drops it into the inbox of a fresh home, where the real"
        " inbox watcher imports it and the memory worker extracts and encodes it, and times"
        " from the drop: imported, every turn extracted, every probe question retrieving its"
        " fact (usable), nothing left to encode (fully encoded); then asks the probes. Once"
        " with every fact encoded (eager, kv_encode_recent_days = all) and once with the"
        " default (lazy), same export and engine. Past --encode-limit a mode stops and"
        " extrapolates from its measured rates.",
    )
    imp.add_argument("--turns", type=int, default=10_000, help="turns of the export (10000)")
    imp.add_argument("--days", type=int, default=1095, help="days they span (1095)")
    imp.add_argument("--probes", type=int, default=20, help="questions, old and recent (20)")
    imp.add_argument(
        "--encode-limit",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="longest wait of the eager mode from the drop; the rest is extrapolated (300)",
    )
    imp.add_argument(
        "--lazy-limit",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="longest wait of the lazy mode, likewise (1800)",
    )
    imp.add_argument("--json", type=Path, metavar="PATH", help="write raw samples as JSON here")
    imp.add_argument(
        "--md",
        type=Path,
        metavar="PATH",
        help="append a dated row with this command to the run log of this Markdown file",
    )
    imp.add_argument("--model", help="local Hugging Face model folder (default: SmolLM2)")
    imp.add_argument(
        "--kv-store-dtype",
        choices=("model", "fp8", "int4"),
        help="how entries are stored (default: the settings' kv_store_dtype)",
    )
    imp.add_argument("--seed", type=int, default=0, help="export and probe seed (0)")
    imp.set_defaults(func=_run_import, parser=imp, plot=None)

    loc = bench_sub.add_parser(
        "locomo",
        help="LoCoMo question answering: F1 (and KL) of injection vs prompt injection",
        description="Answers LoCoMo questions (categories 1-4) with the same retrieved facts and"
        " model by prompt injection and by KV injection (w context turns), scores LoCoMo's"
        " token F1 per category and compares next-token distributions (KL).",
    )
    loc.add_argument("--sample", type=int, default=200, help="questions, seeded (200)")
    loc.add_argument("--k", default="5,20,50", help="comma-separated numbers of facts")
    loc.add_argument(
        "--w",
        default="0,20,20a",
        help="comma-separated context windows for KV injection: 20 = the 20 turns before a"
        " fact, 20a = the anchored window of w=20 (0,20,20a); 'none' for no injection",
    )
    loc.add_argument(
        "--r",
        default="0",
        metavar="RS",
        help="tail recompute: for each window also answer with the r best facts prefilled as"
        " text after the injected rest (inject_w<w>_r<r>@k); comma-separated, e.g. 0,1,2,4,8;"
        " 0 = plain injection (0); an r >= k is skipped at that k (r = k is prompt injection)",
    )
    loc.add_argument(
        "--reference",
        default="",
        metavar="MODES",
        help="also answer in these reference modes: 'reorder' = prompt injection of the same"
        " facts in another seeded order (how far a harmless change moves answers and KL)",
    )
    loc.add_argument("--max-tokens", type=int, default=32, help="answer length limit (32)")
    loc.add_argument("--logprobs", type=int, default=20, help="top logprobs for the KL (20)")
    loc.add_argument("--no-kl", action="store_true", help="skip the KL comparison")
    loc.add_argument("--batch", type=int, default=8, help="questions answered at once (8)")
    loc.add_argument("--data", type=Path, help=data_help)
    loc.add_argument("--resume", action="store_true", help="continue the run saved in --json")
    loc.add_argument(
        "--export-retrieval",
        type=Path,
        metavar="FILE",
        help="only retrieve (MiniLM, no engine) the top max(--k) facts of the sampled questions"
        " and write them to FILE, for --retrieval on a machine without MiniLM (e.g. the GPU"
        " machine: bench/gpu_locomo.py)",
    )
    loc.add_argument(
        "--retrieval",
        type=Path,
        metavar="FILE",
        help="answer on the facts in FILE (from --export-retrieval) instead of retrieving",
    )
    loc.add_argument(
        "--rescore", type=Path, metavar="ANSWERS", help="re-score a saved run (no generation)"
    )
    loc.add_argument(
        "--merge",
        type=Path,
        metavar="OTHER",
        help="with --rescore: add the modes only OTHER (another run's JSON, e.g. a --reference"
        " run) has, on the questions both answered, and score them together",
    )
    loc.add_argument(
        "--judge",
        metavar="MODEL_DIR",
        help="with --rescore: label answers with this local judge model (e.g. on a GPU)",
    )
    _outputs(loc)
    loc.set_defaults(func=_run_locomo, parser=loc)
