"""Run the memory worker in the foreground with progress: after an import, or on request.

Imported turns go through the same extraction and background encoding as live chat; this
drives that work to the end with a progress display (turns left, facts extracted and encoded,
rate, ETA). Encoding runs on the engine (about 25 s to start on a CPU). Ctrl-C stops cleanly;
the next start resumes where it stopped (the fact log is the queue).

This is the explicit "encode it all now": no imported fact is left to be encoded when first
retrieved (``kv_encode_recent_days``), and those deferred so before are encoded too. The disk
budget still holds: what it dropped stays dropped until retrieved.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from app.startup import open_assistant
from inferscale_core import paths, wiring
from inferscale_core.config import AppConfig
from inferscale_core.memory_worker import MemoryWorker


def encode_pending(config: AppConfig, console: Console, poll_s: float = 0.5) -> int:
    """Extract and encode everything pending for the configured profile; exit code."""
    db_path = paths.memory_db()
    assistant = open_assistant(config, console)
    worker = wiring.memory_worker(
        assistant, config, db_path, poll_seconds=poll_s, encode_all=True
    ).start()
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("memory", total=None, info="starting…")
            while not worker.wait_idle(timeout=poll_s):
                progress.update(task, info=_describe(worker), **_counts(worker))
            progress.update(task, info=_describe(worker), **_counts(worker))
    except KeyboardInterrupt:
        console.print("[dim]stopped; the rest is encoded next time[/dim]")
    finally:
        worker.stop()
    stats = worker.stats
    console.print(
        f"extracted {stats.extracted_facts} facts, encoded {stats.encoded_facts}"
        f" ({stats.encode_rate:.1f} facts/s); errors: {stats.errors}"
    )
    if stats.last_error:
        console.print(f"[red]last error:[/red] {stats.last_error}", soft_wrap=True)
    return 0 if stats.errors == 0 else 1


def _counts(worker: MemoryWorker) -> dict[str, float]:
    stats = worker.stats
    done = stats.encoded_facts
    return {"completed": done, "total": done + stats.pending_facts or None}


def _describe(worker: MemoryWorker) -> str:
    stats = worker.stats
    eta = ""
    if stats.encode_rate > 0 and stats.pending_facts:
        left = time.gmtime(stats.pending_facts / stats.encode_rate)
        eta = f", ETA {time.strftime('%H:%M:%S', left)}"
    return (
        f"turns left {stats.pending_turns}, facts extracted {stats.extracted_facts},"
        f" encoded {stats.encoded_facts}, waiting {stats.pending_facts},"
        f" {stats.encode_rate:.1f} facts/s{eta}"
    )
