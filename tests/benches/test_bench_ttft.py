"""Smoke of ``bench ttft`` on the session engine (tiny k, one run) so it cannot rot."""

from __future__ import annotations

import json

import pytest

from bench import ttft
from bench.prompts import FactPrompts, pool_size_for
from bench.report import append_run, write_json

pytestmark = pytest.mark.engine


def test_ttft_bench_smoke_writes_the_documented_json_plot_and_row(runtime, tmp_path):
    source = FactPrompts(runtime.builder, pool_size_for([0, 2]))
    result = ttft.run_ttft(
        source, runtime.engine, [0, 2], runs=1, warmup=0, recompute=[0, 1], model_name="m"
    )
    path = tmp_path / "ttft.json"
    write_json(result, path)
    data = json.loads(path.read_text())
    assert data["bench"] == "ttft" and data["model"] == "m"
    assert {"git_commit", "machine", "versions", "fact_tokens_target", "encode"} <= set(data)
    cells = {(row["k"], row["mode"]): row for row in data["rows"]}
    hybrid = {(2, "inject_r1")}  # r < k only: at k=0 there is no tail to recompute
    assert set(cells) == {(k, mode) for k in (0, 2) for mode in ttft.MODES} | hybrid
    for row in data["rows"]:
        assert row["runs"] == 1 and len(row["samples"]) == 1
        assert 0 < row["ttft_s_median"] <= row["ttft_s_p90"] + 1e-12
    # Injection prefills only the question; prompt injection prefills everything; the warm
    # identical prompt is served from the prefix cache.
    assert cells[(2, "inject")]["injected_tokens"] > 0
    assert cells[(2, "inject")]["computed_tokens"] < cells[(2, "prompt")]["computed_tokens"]
    assert cells[(2, "prompt")]["computed_tokens"] == cells[(2, "prompt")]["prompt_tokens"]
    assert cells[(2, "prompt_warm")]["computed_tokens"] < cells[(2, "prompt")]["computed_tokens"]
    # The hybrid prefills its last fact: less loaded, more computed than plain injection.
    assert 0 < cells[(2, "inject_r1")]["injected_tokens"] < cells[(2, "inject")]["injected_tokens"]
    assert cells[(2, "inject_r1")]["computed_tokens"] > cells[(2, "inject")]["computed_tokens"]
    assert data["recompute"] == [1] and "inject_r1_over_inject_k2" in data["ratios"]
    assert {"prompt_over_inject_k2", "prompt_warm_over_inject_k2"} <= set(data["ratios"])

    ttft.plot(data, tmp_path / "ttft.png")
    assert (tmp_path / "ttft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = tmp_path / "BENCHMARKS.md"
    append_run(md, data, ttft.headline(data))
    assert "| ttft |" in md.read_text() and "k=2: inject" in md.read_text()
