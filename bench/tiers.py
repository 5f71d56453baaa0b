"""``bench tiers``: the cost of injecting k memories from each tier of the KV store.

For every run and tier, a fresh random set of k facts is left on that tier only
(:meth:`KVStore.demote` / :meth:`KVStore.prefetch`), then one injected request measures TTFT
and the connector worker's whole load, timed from outside (reading the tier; re-rotation and
cache writes cost the same for every tier). Against it: the bytes moved and the copy
bandwidth of that tier's link, measured in the same process, whose ratio is the floor.

Tiers: ``device`` (the GPU pool, CUDA only), ``host-pinned`` (CUDA only), ``host`` (plain host
RAM; on a CPU machine the host *is* the device, so nothing is copied), ``disk`` (files read
through the OS page cache, which a recently written or read file is still in: optimistic) and
``disk-cold`` (the files' cached pages dropped first with ``posix_fadvise(DONTNEED)``, so
they come from the block device — as far as the virtual machine's own disk cache allows).
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.prompts import PromptSource
from bench.report import figure, footnote, percentile, provenance, save_figure
from inferscale_core.kvstore import KVStore

TIERS = ("device", "host-pinned", "host", "disk", "disk-cold")


def available_tiers(store: KVStore) -> list[str]:
    if torch.cuda.is_available():
        return list(TIERS) if store.device_tier is not None else list(TIERS[1:])
    return ["host", "disk", "disk-cold"]


def place(store: KVStore, keys: Sequence[str], tier: str) -> int:
    """Leave ``keys`` on ``tier`` (fastest copy); returns their K+V bytes."""
    if tier == "device":
        store.demote(keys, "host")
        report = store.prefetch(keys)
        if report.skipped or report.missing:
            raise RuntimeError(f"the device pool cannot hold the set: {report}")
        return sum(store.header(key).nbytes for key in keys)
    if tier in ("host", "host-pinned"):
        return store.demote(keys, "host", pin=tier == "host-pinned")
    nbytes = store.demote(keys, "disk")
    if tier == "disk-cold":
        for key in keys:
            drop_page_cache(store.path(key))
    return nbytes


def drop_page_cache(path: Path) -> None:
    """Ask the kernel to forget ``path``'s cached pages (clean pages only; no root needed)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_files(paths: Sequence[Path], buffer: bytearray) -> int:
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            view = memoryview(buffer)
            while n := fh.readinto(view[total:]):
                total += n
    return total


def bandwidths(store: KVStore, keys: Sequence[str], repeats: int = 5) -> dict[str, float]:
    """Copy bandwidth of each tier's link in GB/s (median of ``repeats``), for ``keys``' bytes.

    ``memcpy`` (host RAM to host RAM), ``disk`` (the files read with ``read()`` through the
    page cache), ``disk-cold`` (the same after dropping their pages) and, with CUDA,
    ``h2d-pinned``, ``h2d-pageable`` and ``d2d``. The keys are demoted to disk first (memory
    copies of a file mapped by safetensors would keep its pages in the cache).
    """
    nbytes = store.demote(keys, "disk")  # unmapped: the kernel may drop their cached pages
    paths = [store.path(key) for key in keys]
    file_bytes = sum(p.stat().st_size for p in paths)
    out: dict[str, float] = {}

    def timed(fn: Callable[[], Any], size: int, before: Callable[[], Any] = lambda: None) -> float:
        seconds = []
        for _ in range(repeats):
            before()
            t0 = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t0)
        return size / statistics.median(seconds) / 1e9

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    out["memcpy"] = timed(lambda: dst.copy_(src), nbytes)
    buffer = bytearray(file_bytes)
    _read_files(paths, buffer)  # now in the page cache
    out["disk"] = timed(lambda: _read_files(paths, buffer), file_bytes)
    out["disk-cold"] = timed(
        lambda: _read_files(paths, buffer),
        file_bytes,
        before=lambda: [drop_page_cache(p) for p in paths],
    )
    if torch.cuda.is_available():
        gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        pinned = torch.ones(nbytes, dtype=torch.uint8, pin_memory=True)

        def h2d(host: torch.Tensor) -> None:
            gpu.copy_(host, non_blocking=True)
            torch.cuda.synchronize()

        out["h2d-pinned"] = timed(lambda: h2d(pinned), nbytes)
        out["h2d-pageable"] = timed(lambda: h2d(src), nbytes)
        other = torch.empty_like(gpu)
        out["d2d"] = timed(lambda: (other.copy_(gpu), torch.cuda.synchronize()), nbytes)
    return out


def link(tier: str) -> str:
    """The slowest copy ``tier``'s bytes must go through to reach the cache (the floor).

    On a CPU the host tier *is* the device: the one copy left is the write into the cache
    (``memcpy``). A file in the page cache is mapped by safetensors, not read: its floor is
    the same copy. A cold file must come off the disk first (``disk-cold``).
    """
    if not torch.cuda.is_available():
        return {"host": "memcpy", "disk": "memcpy"}.get(tier, tier)
    links = {"device": "d2d", "host-pinned": "h2d-pinned", "host": "h2d-pageable"}
    return links.get(tier, "h2d-pageable" if tier == "disk" else tier)


def run_tiers(
    source: PromptSource,
    engine: Any,  # VllmEngine
    store: KVStore,
    k: int,
    runs: int,
    *,
    tiers: Sequence[str] | None = None,
    warmup: int = 1,
    seed: int = 0,
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "tiers", "rows": [...]}``).

    ``load_ms``: the connector worker's whole load of a request (reading the entries from the
    tier, re-rotation, cache writes), timed around its ``start_load_kv`` from outside, with a
    device sync on each side; ``scheduler_ms``: its scheduler side's calls for the request.
    """
    from bench.probes import connector_clock

    tiers = list(tiers or available_tiers(store))
    if k > source.pool_size:
        raise ValueError(f"k={k} needs a pool of at least that many facts")
    rng = random.Random(seed)
    header = provenance("tiers", model_name, command)
    samples: dict[str, list[dict[str, Any]]] = {tier: [] for tier in tiers}
    with connector_clock(engine, sync=True) as clock:

        def once(tier: str, tag: str) -> dict[str, Any]:
            composed, _ = source.pair(rng.sample(range(source.pool_size), k), tag)
            nbytes = place(store, composed.fact_keys, tier)
            clock.take()
            result = engine.generate(composed, max_tokens=1)
            times = clock.take()
            if result.refused:
                raise RuntimeError(f"injection refused during the benchmark: {result.refused}")
            served = sorted({result.entry_tiers.get(key, "?") for key in composed.fact_keys})
            sample = {
                "ttft_s": result.ttft_s,
                "bytes": nbytes,
                "injected_tokens": result.injected_tokens,
                "served_from": served,
            }
            if "load_us" in times:
                sample["load_ms"] = times["load_us"] / 1e3
            if "scheduler_us" in times:  # the scheduler side's part (its prefetch included)
                sample["scheduler_ms"] = times["scheduler_us"] / 1e3
            return sample

        for i in range(warmup):
            on_progress(f"warm-up {i + 1}/{warmup}")
            for tier in tiers:
                once(tier, f"warm-up {i} {tier}")
        for r in range(runs):
            on_progress(f"run {r + 1}/{runs}")
            for tier in tiers:  # interleaved, so drift hits every tier alike
                samples[tier].append(once(tier, f"run {r} {tier}"))
    on_progress("measuring copy bandwidth")
    keys = source.pair(rng.sample(range(source.pool_size), k), "bandwidth")[0].fact_keys
    bw = bandwidths(store, keys)
    rows = []
    for tier in tiers:
        got = samples[tier]
        nbytes = statistics.median(s["bytes"] for s in got)
        row: dict[str, Any] = {
            "tier": tier,
            "runs": runs,
            "bytes": int(nbytes),
            "ttft_s_median": statistics.median(s["ttft_s"] for s in got),
            "ttft_s_p90": percentile([s["ttft_s"] for s in got], 0.9),
            "link": link(tier),
            "link_gb_s": bw.get(link(tier)),
            "floor_ms": nbytes / bw[link(tier)] / 1e6 if link(tier) in bw else None,
            "served_from": sorted({t for s in got for t in s["served_from"]}),
            "samples": got,
        }
        if all("load_ms" in s for s in got):  # the tier's cost is inside the whole load
            row["load_ms_median"] = statistics.median(s["load_ms"] for s in got)
        if all("scheduler_ms" in s for s in got):
            row["scheduler_ms_median"] = statistics.median(s["scheduler_ms"] for s in got)
        rows.append(row)
    return {
        **header,
        "facts": source.description,
        "k": k,
        "warmup": warmup,
        "seed": seed,
        "bandwidth_gb_s": bw,
        "page_cache_note": (
            "'disk' reads go through the OS page cache (files written or read recently are"
            " still cached): it is optimistic. 'disk-cold' drops the files' pages first"
            " (posix_fadvise DONTNEED)."
        ),
        "rows": rows,
    }


def headline(result: dict[str, Any]) -> str:
    parts = []
    for row in result["rows"]:
        load = row.get("load_ms_median")
        extra = f" (load {load:.0f} ms, floor {row['floor_ms']:.0f})" if load is not None else ""
        parts.append(f"{row['tier']} {row['ttft_s_median'] * 1e3:.0f} ms{extra}")
    mb = result["rows"][0]["bytes"] / 1e6
    return f"k={result['k']} ({mb:.0f} MB): " + "; ".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    """Per tier: the connector's load and the rest of TTFT; the copy floor marked."""
    fig, ax = figure()
    rows = result["rows"]
    names = [row["tier"] for row in rows]
    bottom = [row.get("load_ms_median") or 0.0 for row in rows]
    ax.bar(names, bottom, label="load: read the tier, re-rotate K, write the cache")
    rest = [max(0.0, row["ttft_s_median"] * 1e3 - b) for row, b in zip(rows, bottom, strict=True)]
    ax.bar(names, rest, bottom=bottom, label="rest of TTFT (forward, scheduling)", alpha=0.4)
    floors = [row.get("floor_ms") for row in rows]
    ax.scatter(names, [f or 0 for f in floors], marker="_", s=900, color="k", label="copy floor")
    ax.set_ylabel("ms (median)")
    mb = rows[0]["bytes"] / 1e6
    ax.set_title(f"Injection from each tier, k={result['k']} ({mb:.0f} MB of K+V)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
