"""Smoke of ``bench ttft`` on the session engine (tiny k, one run) so it cannot rot."""

from __future__ import annotations

import json

import pytest

from inferscale_core.bench.ttft import run_ttft, write_json

pytestmark = pytest.mark.engine


def test_ttft_bench_smoke_writes_the_documented_json(runtime, tmp_path):
    result = run_ttft(runtime.builder, runtime.engine, [0, 2], runs=1, warmup=0, model_name="m")
    path = tmp_path / "ttft.json"
    write_json(result, path)
    data = json.loads(path.read_text())
    assert data["bench"] == "ttft" and data["model"] == "m"
    cells = {(row["k"], row["mode"]): row for row in data["rows"]}
    assert set(cells) == {(0, "inject"), (0, "prompt"), (2, "inject"), (2, "prompt")}
    for row in data["rows"]:
        assert row["runs"] == 1 and len(row["samples"]) == 1
        assert 0 < row["ttft_s_median"] <= row["ttft_s_p90"] + 1e-12
    # Injection prefills only the question; prompt injection prefills everything.
    assert cells[(2, "inject")]["injected_tokens"] > 0
    assert cells[(2, "inject")]["computed_tokens"] < cells[(2, "prompt")]["computed_tokens"]
    assert cells[(2, "prompt")]["computed_tokens"] == cells[(2, "prompt")]["prompt_tokens"]
    assert "prompt_over_inject_k2" in data["ratios"]
