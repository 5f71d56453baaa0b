"""``inferscale-assistant bench …``: runs a benchmark on the configured model and prints it."""

from __future__ import annotations

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
