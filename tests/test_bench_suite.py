"""Smoke runs of ``bench throughput / tiers / encode / locomo`` on the session engine.

Tiny sizes (k of 2, a run or two, a few questions), so the benches cannot rot; the figures
themselves come from the commands in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json

import pytest

from inferscale_core.bench import encode, locomo, throughput, tiers
from inferscale_core.bench.locomo_data import DEFAULT_PATH
from inferscale_core.bench.prompts import FactPrompts
from inferscale_core.bench.report import write_json

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not DEFAULT_PATH.is_file(), reason="LoCoMo data not beside the repo"),
]


@pytest.fixture(scope="module")
def facts(runtime):
    return FactPrompts(runtime.builder, pool_size=6)


def test_generate_batch_runs_requests_together_in_order(runtime, facts):
    pairs = [facts.pair([i, i + 1], f"batch {i}") for i in range(3)]
    results = runtime.engine.generate_batch(
        [composed for composed, _ in pairs], max_tokens=3, ignore_eos=True
    )
    assert [r.prompt_tokens for r in results] == [len(c.prompt_ids) for c, _ in pairs]
    for result in results:
        assert len(result.token_ids) == 3 and result.injected_tokens > 0
        assert 0 < result.ttft_s <= result.total_s
    one = runtime.engine.generate(pairs[1][0], max_tokens=3, ignore_eos=True)
    assert one.token_ids == results[1].token_ids  # batching changes nothing (fp32, greedy)


def test_throughput_smoke(runtime, facts, tmp_path):
    result = throughput.run_throughput(
        facts, runtime.engine, [1, 2], k=2, runs=1, max_tokens=2, warmup=0
    )
    cells = {(row["users"], row["mode"]): row for row in result["rows"]}
    assert set(cells) == {(n, m) for n in (1, 2) for m in throughput.MODES}
    assert len(cells[(2, "inject")]["ttft_s"]) == 2
    assert cells[(2, "inject")]["computed_tokens"] < cells[(2, "prompt")]["computed_tokens"]
    assert "inject_over_prompt_rps_u2" in result["ratios"]
    throughput.plot(result, tmp_path / "throughput.png")
    assert throughput.headline(result).startswith("2 users, k=2")


def test_tiers_smoke_serves_each_run_from_the_asked_tier(runtime, facts, tmp_path):
    result = tiers.run_tiers(
        facts,
        runtime.engine,
        runtime.store,
        k=2,
        runs=1,
        warmup=0,
        tiers=["host", "disk", "disk-cold"],
    )
    rows = {row["tier"]: row for row in result["rows"]}
    assert rows["host"]["served_from"] == ["host"]
    assert rows["disk"]["served_from"] == rows["disk-cold"]["served_from"] == ["disk"]
    for row in rows.values():
        assert row["bytes"] > 0 and row["floor_ms"] > 0
        assert row["read_ms_median"] >= 0 and row["write_ms_median"] > 0
    assert {"memcpy", "disk", "disk-cold"} <= set(result["bandwidth_gb_s"])
    tiers.plot(result, tmp_path / "tiers.png")


def test_encode_smoke_extrapolates_and_leaves_nothing_behind(runtime):
    before = set(runtime.store.keys())
    result = encode.run_encode(runtime.builder, DEFAULT_PATH, [0, 2], limit=3)
    assert [row["w"] for row in result["rows"]] == [0, 2]
    for row in result["rows"]:
        assert row["facts"] == 3 and row["all_facts"] == 2541 and row["all_extrapolated"]
        assert row["facts_per_s"] > 0
    w0, w2 = result["rows"]
    assert w2["context_tokens"] > w0["context_tokens"]  # the context turns are encoded too
    assert set(runtime.store.keys()) <= before | {runtime.builder.prefix_key}


def test_locomo_smoke_answers_scores_rescores_and_judges(runtime, tmp_path):
    path = tmp_path / "locomo.json"
    result = locomo.run_locomo(
        runtime.builder,
        runtime.engine,
        DEFAULT_PATH,
        sample=2,
        ks=[1, 3],
        ws=[0, 1],
        max_tokens=4,
        json_path=path,
    )
    saved = json.loads(path.read_text())
    assert len(saved["questions"]) == 2
    cells = saved["scores"]["cells"]
    assert set(cells) == {f"{m}@k{k}" for k in (1, 3) for m in ("prompt", "inject_w0", "inject_w1")}
    for q in saved["questions"]:
        assert len(q["retrieved"]) == 3
        for key, answer in q["answers"].items():
            assert answer["text"] and answer["tokens"] <= 4
            if key.startswith("inject"):
                baseline = q["answers"]["prompt@" + key.split("@")[1]]
                assert answer["injected_tokens"] > 0
                assert len(answer["kl"]["per_token"]) == baseline["tokens"]
    assert cells["inject_w0@k3"]["kl_mean_per_token"] >= 0
    assert 0 <= cells["inject_w0@k3"]["top1_agreement"] <= 1
    # k=1 with w=0: the one fact is encoded right after the prefix, so injection is exact.
    assert cells["inject_w0@k1"]["top1_agreement"] == 1.0
    assert cells["inject_w0@k1"]["kl_mean_per_token"] < 1e-3
    assert locomo.score(saved) == saved["scores"]  # re-scoring a saved run gives the same

    saved["questions"] = saved["questions"][:1]
    judged = locomo.judge_answers(  # the session model stands in for a judge
        saved, runtime.engine, runtime.builder.layout.tokenizer, "smollm2"
    )
    labels = [a["judged"] for q in judged["questions"] for a in q["answers"].values()]
    assert all(label in (True, False, None) for label in labels)
    assert "judged_accuracy" in judged["scores"]["cells"]["prompt@k1"]
    locomo.plot(result, tmp_path / "locomo.png")
    write_json(judged, tmp_path / "judged.json")
