"""Retrieval latency of this checkout against another, in one run (``bench recall
--latency-vs TREE``).

Timing two checkouts one after the other on a small virtual machine measures the machine as
much as the code. On the 2-vCPU AMD EPYC (2026-12-07) the question's embedding alone moved
between 15 and 19 ms p50 from one pass to the next of a single process, and four plus three
whole runs alternated (fa5985f against b266d60) put +13% / +22% on hybrid search at k = 10 / 50,
where the pairing below, on the same machine the same afternoon, measured +3% / +3%.

So both checkouts run at once, each in a process of its own with a profile of its own, filled
to the same N facts as :func:`bench.recall_latency.fill_profile` fills it (each checkout's own
extractor, so what each would hold). Each then waits, asleep on a FIFO, until told to time a
block of questions: per question the embedding alone (on the retrieval thread) and one
``Retriever.search`` per k and mode, back to back, as ``bench recall`` times them. The blocks
alternate A B, B A, A B, ... (a drift that is linear over two pairs cancels), both checkouts
ask block i's questions, and each mode's ratio is reported both as the ratio of the two p50s
and as the median of the per-pair ratios of block medians.

The worker is this file run as a script from a temporary folder, the checkout's root first on
``sys.path``, so it uses only what every checkout since the retrieval thread (b266d60) has:
``fill_profile``, ``CachedEmbedder``, ``Retriever.search`` and the retrieval thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MODES = ("hybrid", "dense", "keyword")
PER_BLOCK = 10
"""Questions a block times (each at every k and mode): ~1.3 s of work at 10k facts."""
READY_TIMEOUT_S = 900.0
"""How long filling both profiles may take (two processes at once on two cores: ~3 min)."""
BLOCK_TIMEOUT_S = 300.0


def run_pair(
    data: Path | str,
    other: Path | str,
    *,
    facts: int,
    queries: int = 200,
    ks: Sequence[int] = (10, 50),
    blocks: int = 38,
    seed: int = 0,
    warmup: int = 10,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Time this checkout's searches against ``other``'s (a checkout's root: a ``git
    worktree`` of another commit), ``blocks`` blocks each, alternated (module docstring).

    Returns ``{"vs", "facts", "queries", "k", "blocks", "per_block", "ms"}`` where
    ``ms[str(k)][mode]`` (and ``ms["embed"]``) = ``{"this_p50", "other_p50", "ratio_p50",
    "pair_ratio_median"}``; a ratio above 1 means this checkout is slower."""
    here = Path(__file__).resolve().parents[1]
    other = Path(other).resolve()
    if not (other / "inferscale_core" / "retriever.py").is_file():
        raise ValueError(f"{other} is not a checkout of this project (no inferscale_core)")
    if facts < 1 or blocks < 2 or queries <= warmup or not ks:
        raise ValueError("need facts >= 1, blocks >= 2, queries > warmup and some k")
    with tempfile.TemporaryDirectory(prefix="inferscale-pair-") as tmp:
        work = Path(tmp)
        script = work / "worker.py"
        shutil.copyfile(__file__, script)
        done = work / "done"
        os.mkfifo(done)
        done_fd = os.open(done, os.O_RDWR)
        workers = []
        for name, tree in (("this", here), ("other", other)):
            command = work / f"{name}.cmd"
            os.mkfifo(command)
            args = [sys.executable, str(script), "--data", str(Path(data).resolve())]
            args += ["--facts", str(facts), "--queries", str(queries), "--seed", str(seed)]
            args += ["--k", ",".join(map(str, ks)), "--warmup", str(warmup)]
            args += ["--command", str(command), "--done", str(done), "--name", name]
            args += ["--out", str(work / f"{name}.json")]
            log = open(work / f"{name}.log", "w")  # noqa: SIM115 (closed below)
            env = {**os.environ, "PYTHONPATH": str(tree)}
            process = subprocess.Popen(args, cwd=tree, env=env, stdout=log, stderr=log)
            workers.append((name, os.open(command, os.O_RDWR), process, log))
        try:
            on_progress(f"filling a profile of {facts:,} facts in each checkout…")
            _wait(done_fd, 2, READY_TIMEOUT_S, workers, work)
            for block in range(blocks):
                order = workers if block % 2 == 0 else workers[::-1]
                for _, command_fd, _, _ in order:
                    os.write(command_fd, b"r")
                    _wait(done_fd, 1, BLOCK_TIMEOUT_S, workers, work)
                on_progress(f"block {block + 1} of {blocks} timed on both checkouts")
            for _, command_fd, _, _ in workers:
                os.write(command_fd, b"q")
            _wait(done_fd, 2, BLOCK_TIMEOUT_S, workers, work)
            timed = {name: json.loads((work / f"{name}.json").read_text()) for name, *_ in workers}
        finally:
            for _, command_fd, process, log in workers:
                if process.poll() is None:
                    process.kill()
                process.wait()
                os.close(command_fd)
                log.close()
            os.close(done_fd)
    from bench.report import head_commit  # here: the worker (this file) runs in other checkouts

    return {
        "vs": {"tree": str(other), "git_commit": head_commit(other)},
        "facts": timed["this"]["facts"],
        "facts_other": timed["other"]["facts"],
        "queries": queries - warmup,
        "k": list(ks),
        "blocks": blocks,
        "per_block": PER_BLOCK,
        "ms": _compare(timed["this"]["blocks"], timed["other"]["blocks"]),
    }


def _wait(fd: int, count: int, timeout: float, workers: list, work: Path) -> None:
    """Read ``count`` bytes from the done FIFO; a worker that exits first, or a timeout, is
    an error with the worker's last lines."""
    deadline = time.monotonic() + timeout
    while count > 0:
        readable, _, _ = select.select([fd], [], [], 1.0)
        if readable:
            count -= len(os.read(fd, count))
            continue
        for name, _, process, _ in workers:
            if process.poll() is not None:
                raise RuntimeError(f"the {name} checkout's worker exited: {_tail(work, name)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no worker answered in {timeout:.0f} s: {_tail(work, 'other')}")


def _tail(work: Path, name: str) -> str:
    path = work / f"{name}.log"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return " | ".join(lines[-6:]) or "(no output)"


def _compare(
    this: list[dict[str, list[float]]], other: list[dict[str, list[float]]]
) -> dict[str, Any]:
    """Per timed cell (``"embed"``, ``"<k>/<mode>"``): both p50s over all blocks, their ratio,
    and the median over blocks of this block's median over the other's."""
    cells: dict[str, Any] = {}
    for cell in this[0]:
        mine = [s for block in this for s in block[cell]]
        theirs = [s for block in other for s in block[cell]]
        pairs = [
            statistics.median(a[cell]) / statistics.median(b[cell])
            for a, b in zip(this, other, strict=True)
        ]
        this_p50, other_p50 = statistics.median(mine) * 1e3, statistics.median(theirs) * 1e3
        entry = {
            "this_p50": round(this_p50, 2),
            "other_p50": round(other_p50, 2),
            "ratio_p50": round(this_p50 / other_p50, 3),
            "pair_ratio_median": round(statistics.median(pairs), 3),
        }
        if cell == "embed":
            cells["embed"] = entry
        else:
            k, mode = cell.split("/")
            cells.setdefault(k, {})[mode] = entry
    return cells


def markdown(pair: dict[str, Any]) -> str:
    """The paired table of ``bench recall --latency-vs``."""
    vs = pair["vs"]
    lines = [
        f"Search latency at {pair['facts']:,} facts against {vs['git_commit'] or vs['tree']}"
        f" ({pair['facts_other']:,} facts there), {pair['blocks']} alternated blocks of"
        f" {pair['per_block']} questions each (ratio > 1: this checkout is slower)",
        "",
        "| k | mode | this p50 | other p50 | ratio of p50s | median pair ratio |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    rows = [("", "embed", pair["ms"]["embed"])]
    rows += [(k, m, cell) for k in map(str, pair["k"]) for m, cell in pair["ms"][k].items()]
    for k, mode, cell in rows:
        lines.append(
            f"| {k} | {mode} | {cell['this_p50']:.2f} ms | {cell['other_p50']:.2f} ms"
            f" | {cell['ratio_p50']:.3f} | {cell['pair_ratio_median']:.3f} |"
        )
    return "\n".join(lines)


# -- the worker: runs in a checkout's own environment (either commit) -----------------------


def _worker(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--data", "--command", "--done", "--name", "--out", "--k"):
        parser.add_argument(flag, required=True)
    for flag in ("--facts", "--queries", "--seed", "--warmup"):
        parser.add_argument(flag, type=int, required=True)
    args = parser.parse_args(argv)
    from bench.locomo_data import load, questions
    from bench.recall_latency import fill_profile
    from bench.recall_memory import CachedEmbedder
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.factlog import FactLog
    from inferscale_core.retriever import Retriever

    ks = [int(k) for k in args.k.split(",")]
    command, done = os.open(args.command, os.O_RDWR), os.open(args.done, os.O_RDWR)
    embedder = SentenceTransformerEmbedder()
    tmp = tempfile.TemporaryDirectory(prefix="inferscale-pair-worker-")
    with tmp, FactLog.open(Path(tmp.name) / "latency.db") as factlog:
        profile = fill_profile(factlog, args.data, CachedEmbedder(embedder), args.facts)
        facts = factlog.count_facts(profile).get("active", 0)
        asked = [q.question for q in questions(load(args.data))]
        chosen = random.Random(args.seed).sample(asked, min(args.queries, len(asked)))
        retriever = Retriever(factlog, embedder)
        thread = getattr(retriever, "thread", None)
        if thread is None:  # before a retriever owned one: the process's
            from inferscale_core import retrieval_thread as thread  # type: ignore[no-redef]
        for question in chosen[: args.warmup]:
            for k in ks:
                for mode in MODES:
                    retriever.search(profile, question, k, mode=mode)
        timed = chosen[args.warmup :]
        blocks: list[dict[str, list[float]]] = []
        os.write(done, b"R")
        while os.read(command, 1) == b"r":
            block: dict[str, list[float]] = {"embed": []}
            start_at = len(blocks) * PER_BLOCK
            for i in range(PER_BLOCK):
                question = timed[(start_at + i) % len(timed)]
                start = time.perf_counter()
                thread.submit(embedder.embed, [question]).result()
                block["embed"].append(time.perf_counter() - start)
                for k in ks:
                    for mode in MODES:
                        start = time.perf_counter()
                        retriever.search(profile, question, k, mode=mode)
                        block.setdefault(f"{k}/{mode}", []).append(time.perf_counter() - start)
            blocks.append(block)
            os.write(done, b"d")
    Path(args.out).write_text(json.dumps({"name": args.name, "facts": facts, "blocks": blocks}))
    os.write(done, b"d")


if __name__ == "__main__":
    _worker(sys.argv[1:])
