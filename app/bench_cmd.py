"""``inferscale-assistant bench …``: runs a benchmark on the configured model and prints it."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table


def run_bench_ttft(
    ks: list[int],
    runs: int,
    warmup: int,
    json_path: Path | None,
    model: str | None,
    seed: int,
    *,
    verbose: bool,
    console: Console,
) -> int:
    from app.runtime import open_runtime
    from inferscale_core.bench.ttft import run_ttft, write_json

    runtime = open_runtime(model, console, verbose=verbose)
    with console.status("benchmarking…") as status:
        result = run_ttft(
            runtime.builder,
            runtime.engine,
            ks,
            runs,
            warmup=warmup,
            seed=seed,
            model_name=runtime.model_dir.name,
            on_progress=lambda m: status.update(m),
        )
    table = Table(title=f"TTFT on {result['model']} ({runs} runs per cell)", title_justify="left")
    for column in ("k", "mode", "median", "p90", "prompt tok", "computed", "injected"):
        table.add_column(column, justify="right" if column not in ("mode",) else "left")
    for row in result["rows"]:
        table.add_row(
            str(row["k"]),
            row["mode"],
            f"{row['ttft_s_median'] * 1e3:.0f} ms",
            f"{row['ttft_s_p90'] * 1e3:.0f} ms",
            str(row["prompt_tokens"]),
            str(row["computed_tokens"]),
            str(row["injected_tokens"]),
        )
    Console().print(table)
    for name, value in result["ratios"].items():
        Console().print(f"{name}: {value:.2f}")
    if json_path:
        write_json(result, json_path)
        console.print(f"[dim]wrote {json_path}[/dim]")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure: TTFT of KV injection vs prompt injection")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    ttft = bench_sub.add_parser(
        "ttft",
        help="time to first token with k synthetic memories, injection vs prompt injection",
        description="For each k, each run draws k synthetic facts (~50 tokens each) in a random"
        " order and measures TTFT of KV injection and of prompt injection (prefix caching on) in"
        " the same engine, then prints medians, p90 and the ratio.",
    )
    ttft.add_argument(
        "--k", default="0,5,20,50", help="comma-separated numbers of facts (0,5,20,50)"
    )
    ttft.add_argument("--runs", type=int, default=5, help="measured runs per k and mode (5)")
    ttft.add_argument("--warmup", type=int, default=2, help="warm-up runs per mode (2)")
    ttft.add_argument("--json", type=Path, metavar="PATH", help="write raw samples as JSON here")
    ttft.add_argument("--model", help="local Hugging Face model folder (default: SmolLM2)")
    ttft.add_argument("--seed", type=int, default=0, help="fact sampling seed (0)")
    ttft.set_defaults(func=_run_ttft, parser=ttft)


def parse_ks(text: str) -> list[int]:
    """``"0,5,20"`` -> ``[0, 5, 20]``; ValueError with a clear message otherwise."""
    try:
        ks = sorted({int(k) for k in text.split(",") if k.strip()})
    except ValueError:
        raise ValueError(f"--k takes comma-separated whole numbers, got {text!r}") from None
    if not ks or min(ks) < 0:
        raise ValueError(f"--k needs whole numbers >= 0, got {text!r}")
    return ks


def _run_ttft(args: argparse.Namespace, console: Console) -> int:
    try:
        ks = parse_ks(args.k)
    except ValueError as exc:
        args.parser.error(str(exc))
    if args.runs < 1:
        args.parser.error("--runs must be at least 1")
    return run_bench_ttft(
        ks,
        args.runs,
        args.warmup,
        args.json,
        args.model,
        args.seed,
        verbose=args.verbose,
        console=console,
    )
