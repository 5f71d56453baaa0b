"""The soak bench's memory report: what /proc says of a process tree, and growth from the first
sample after the warm-up (the load itself runs against the real server in tests/serve)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.serve_soak import growth, sample


def test_a_sample_holds_this_process_and_its_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = sample(os.getpid(), 1.0)
    finally:
        child.kill()
        child.wait()
    mine, its = now["processes"][str(os.getpid())], now["processes"][str(child.pid)]
    assert 0 < mine["anon_kib"] <= mine["rss_kib"] and its["rss_kib"] > 0
    assert now["rss_kib"] == sum(p["rss_kib"] for p in now["processes"].values())


def test_growth_starts_after_the_warm_up_and_follows_each_process():
    def at(t: float, server: int, worker: int | None) -> dict:
        processes = {"1": {"name": "python", "rss_kib": server, "anon_kib": server // 2}}
        if worker is not None:  # a process that appears later is followed from then on
            processes["2"] = {"name": "VLLM::Worker", "rss_kib": worker, "anon_kib": worker}
        total = sum(p["rss_kib"] for p in processes.values())
        anon = sum(p["anon_kib"] for p in processes.values())
        return {"t_s": t, "rss_kib": total, "anon_kib": anon, "processes": processes}

    samples = [at(0, 512, None), at(10, 1024, None), at(20, 1024, 1024), at(30, 1536, 1024)]
    report = growth(samples, warmup_s=10)
    assert report["baseline_t_s"] == 10
    assert (report["baseline_mib"], report["end_mib"], report["growth_pct"]) == (1.0, 2.5, 150.0)
    server, worker = report["processes"]
    assert (server["pid"], server["growth_pct"], server["max_growth_pct"]) == (1, 50.0, 50.0)
    assert (worker["name"], worker["baseline_mib"], worker["growth_pct"]) == ("VLLM::Worker", 1, 0)
