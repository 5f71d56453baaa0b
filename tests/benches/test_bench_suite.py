"""Smoke runs of ``bench throughput / tiers / encode / locomo`` and of the suite's step anatomy
on the session engine, and of
``bench retrieval`` (no engine: MiniLM and the vector indexes, exact only on the CPU).

Tiny sizes (k of 2, a run or two, a few questions), so the benches cannot rot; the figures
themselves come from the commands in docs/BENCHMARKS.md. The LoCoMo benches run on our own
LoCoMo-format fixture (``tests/fixtures/locomo/``), never on the real ``locomo10.json``.
"""

from __future__ import annotations

import itertools
import json
from datetime import date

import pytest
import torch

from bench import encode, locomo, locomo_data, retrieval, throughput, tiers
from bench.diagnose import step_anatomy
from bench.diagnose.step_anatomy import summarize_trace
from bench.prompts import FactPrompts
from bench.report import write_json
from tests.support import LOCOMO_FIXTURE

pytestmark = pytest.mark.engine

DATA = LOCOMO_FIXTURE
#: Every observation of the fixture is a fact (their texts are unique within a sample).
FACTS = sum(len(locomo_data.observations(s)) for s in locomo_data.load(DATA))


@pytest.fixture(scope="module")
def facts(runtime):
    return FactPrompts(runtime.builder, pool_size=6)


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
        assert 0 < row["load_ms_median"] < row["ttft_s_median"] * 1e3
    assert {"memcpy", "disk", "disk-cold"} <= set(result["bandwidth_gb_s"])
    tiers.plot(result, tmp_path / "tiers.png")


def test_encode_smoke_extrapolates_and_leaves_nothing_behind(runtime):
    assert FACTS == 50  # the fixture's observations, all of which the encode bench counts
    before = set(runtime.store.keys())
    result = encode.run_encode(runtime.builder, DATA, [0, 2], limit=3)
    assert [row["w"] for row in result["rows"]] == [0, 2]
    for row in result["rows"]:
        assert row["facts"] == 3 and row["all_facts"] == FACTS and row["all_extrapolated"]
        assert row["facts_per_s"] > 0
    w0, w2 = result["rows"]
    assert w2["context_tokens"] > w0["context_tokens"]  # the context turns are encoded too
    assert set(runtime.store.keys()) <= before | {runtime.builder.prefix_key}


def test_gpu_encode_smoke_on_cpu_writes_the_json(smollm2_path, tmp_path):
    """The GPU encoding bench, run on the CPU in a process of its own (its own engine): the
    2-layer tiny Llama shape on dummy weights, 3 facts, through the engine's capture."""
    from bench import gpu_encode
    from tests.support.repo_process import run_python

    argv = ["-m", "bench.gpu_encode", str(tmp_path), "--tokenizer", str(smollm2_path)]
    argv += ["--data", str(DATA), "--shape", "tiny-llama", "--ws", "0,2,2a", "--limit", "3"]
    done = run_python([*argv, "--batch-size", "2"], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_encode.json").read_text())
    assert result["bench"] == "gpu-encode" and "EngineEncoder" in result["path"]
    assert (result["gpu"], result["dtype"], result["shape"]) == (None, "float32", "tiny-llama")
    assert result["batch_size"] == 2 and result["limit"] == 3
    assert result["captured"] >= 3 * 3  # every fact of every window captured from the cache
    cells = {row["spec"]: row for row in result["rows"]}
    assert set(cells) == {"0", "2", "2a"}
    assert [cells[s]["window"] for s in ("0", "2", "2a")] == ["sliding", "sliding", "anchored"]
    for row in cells.values():
        assert row["facts"] == 3 and row["all_facts"] == FACTS and row["all_extrapolated"]
        assert row["facts_per_s"] > 0 and row["tokens_per_s"] > 0 and row["seconds"] > 0
        assert row["all_seconds"] == pytest.approx(FACTS / row["facts_per_s"])
        assert 0 < row["all_floor_seconds"] < row["all_seconds"]
        # what the engine prefilled: at most what it was given (the prefix cache serves the rest)
        assert 0 < row["prefilled_tokens"] <= row["fact_tokens"] + row["context_tokens"]
    assert cells["2"]["context_tokens"] > cells["0"]["context_tokens"]
    assert cells["2a"]["context_tokens"] >= cells["2"]["context_tokens"]  # w to 2w - 1 turns
    assert result["target"] == {
        "w": 20,
        "all_seconds": gpu_encode.TARGET_S,
        "anchored_all_seconds": gpu_encode.TARGET_ANCHORED_S,
        "met": None,
        "anchored_met": None,
    }


def test_locomo_smoke_answers_scores_rescores_and_judges(runtime, tmp_path):
    path = tmp_path / "locomo.json"
    settings = {"sample": 2, "ks": [1, 3], "ws": [0, 1, "1a"], "max_tokens": 4}
    result = locomo.run_locomo(
        runtime.builder,
        runtime.engine,
        DATA,
        **settings,
        reference=["reorder"],
        json_path=path,
    )
    saved = json.loads(path.read_text())
    assert len(saved["questions"]) == 2
    cells = saved["scores"]["cells"]
    modes = ("prompt", "inject_w0", "inject_w1", "inject_w1a", "reorder")
    assert set(cells) == {f"{m}@k{k}" for k in (1, 3) for m in modes}
    for q in saved["questions"]:
        assert len(q["retrieved"]) == 3
        for key, answer in q["answers"].items():
            assert answer["text"] and answer["tokens"] <= 4
            if not key.startswith("prompt@"):
                baseline = q["answers"]["prompt@" + key.split("@")[1]]
                assert (answer["injected_tokens"] > 0) == key.startswith("inject")
                assert len(answer["kl"]["per_token"]) == baseline["tokens"]
    assert cells["inject_w0@k3"]["kl_mean_per_token"] >= 0
    assert 0 <= cells["inject_w0@k3"]["top1_agreement"] <= 1
    # k=1 with w=0: the one fact is encoded right after the prefix, so injection is exact;
    # and one fact has one order, so the reorder reference is the prompt itself.
    for cell in ("inject_w0@k1", "reorder@k1"):
        assert cells[cell]["top1_agreement"] == 1.0
        assert cells[cell]["kl_mean_per_token"] < 1e-3
    assert locomo.score(saved) == saved["scores"]  # re-scoring a saved run gives the same
    # A run saved before reference modes and tail recompute existed resumes (nothing to answer).
    old = json.loads(path.read_text())
    assert old["settings"]["rs"] == [0]
    del old["settings"]["reference"], old["settings"]["rs"]
    for q in old["questions"]:
        q["answers"] = {c: a for c, a in q["answers"].items() if not c.startswith("reorder")}
    resumed = locomo.run_locomo(runtime.builder, runtime.engine, DATA, **settings, resume=old)
    assert [q["answers"] for q in resumed["questions"]] == [q["answers"] for q in old["questions"]]

    saved["questions"] = saved["questions"][:1]
    judged = locomo.judge_answers(  # the session model stands in for a judge
        saved, runtime.engine, runtime.builder.layout.tokenizer, "smollm2"
    )
    labels = [a["judged"] for q in judged["questions"] for a in q["answers"].values()]
    assert all(label in (True, False, None) for label in labels)
    assert "judged_accuracy" in judged["scores"]["cells"]["prompt@k1"]
    locomo.plot(result, tmp_path / "locomo.png")
    write_json(judged, tmp_path / "judged.json")

    # The GPU machine's way: MiniLM's hits exported here, answered on there.
    hits_file = tmp_path / "retrieval.json"
    locomo.export_retrieval(DATA, hits_file, sample=2, k=3)
    exported = json.loads(hits_file.read_text())["questions"]
    for q in result["questions"]:
        texts = [result["facts"][str(fact_id)] for fact_id, _ in q["retrieved"]]
        assert [text for text, _ in exported[q["id"]]] == texts
    replay = locomo.run_locomo(
        runtime.builder,
        runtime.engine,
        DATA,
        sample=2,
        ks=[1],
        ws=[0],
        max_tokens=4,
        kl=False,
        retrieval=hits_file,
    )
    for before, after in zip(result["questions"], replay["questions"], strict=True):
        assert after["retrieved"][-1][0] == before["retrieved"][-1][0]  # the best hit
        assert after["answers"]["prompt@k1"]["text"] == before["answers"]["prompt@k1"]["text"]
    with pytest.raises(ValueError, match="holds the top 3 facts; this run needs 5"):
        locomo.run_locomo(
            runtime.builder, runtime.engine, DATA, sample=2, ks=[5], retrieval=hits_file
        )
    with pytest.raises(ValueError, match="lacks 1 of the 3 questions"):
        locomo.run_locomo(
            runtime.builder, runtime.engine, DATA, sample=3, ks=[1], retrieval=hits_file
        )
    first = next(iter(exported))
    exported[first][0][0] = "Nobody said this."
    tampered = json.loads(hits_file.read_text())
    tampered["questions"] = exported
    write_json(tampered, hits_file)
    with pytest.raises(ValueError, match="exported from other data"):
        locomo.run_locomo(
            runtime.builder, runtime.engine, DATA, sample=2, ks=[3], retrieval=hits_file
        )


def test_locomo_tail_recompute_cells_are_scored_against_prompt_injection(runtime, tmp_path):
    """``rs=[0, 1]``: an ``inject_w0_r1`` cell wherever r < k, with KL against ``prompt@k``.

    At k=2 with w=0 the hybrid is exact: the injected fact follows the prefix alone, as in
    the prompt, and the recomputed one is prefilled after it, as in the prompt.
    """
    path = tmp_path / "locomo-r.json"
    result = locomo.run_locomo(
        runtime.builder,
        runtime.engine,
        DATA,
        sample=2,
        ks=[1, 2],
        ws=[0],
        rs=[1, 0],
        max_tokens=4,
        json_path=path,
    )
    assert result["settings"]["rs"] == [0, 1]
    cells = result["scores"]["cells"]
    assert list(cells) == [
        "prompt@k1", "inject_w0@k1", "prompt@k2", "inject_w0@k2", "inject_w0_r1@k2",
    ]  # fmt: skip
    hybrid, plain = cells["inject_w0_r1@k2"], cells["inject_w0@k2"]
    assert hybrid["n"] == 2 and hybrid["kl_tokens"] > 0
    assert hybrid["top1_agreement"] == 1.0 and hybrid["kl_mean_per_token"] < 1e-3
    # The recomputed fact is prefilled instead of loaded.
    assert 0 < hybrid["injected_tokens_median"] < plain["injected_tokens_median"]
    assert plain["computed_tokens_median"] < hybrid["computed_tokens_median"]
    for q in result["questions"]:
        answer = q["answers"]["inject_w0_r1@k2"]
        assert len(answer["kl"]["per_token"]) == q["answers"]["prompt@k2"]["tokens"]
    assert locomo.score(json.loads(path.read_text())) == result["scores"]
    assert "w0 r1" in locomo.headline(result)
    locomo.plot(result, tmp_path / "locomo-r.png")  # the sweep's layout: F1 and KL against r


def test_build_with_every_fact_recomputed_is_prompt_injection(runtime):
    """``recompute=len(facts)`` gives prompt injection's ids, nothing but the prefix injected;
    a partial recompute keeps the ids and drops the tail's entries."""
    from inferscale_core.prompt_builder import MemoryFact

    builder = runtime.builder
    facts = [
        MemoryFact("Nadia baked a lemon cake for her sister.", date(2023, 5, 8)),
        MemoryFact("Tomas adopted a beagle mix from the shelter."),
        MemoryFact("Nadia runs the city marathon every October.", date(2023, 10, 1)),
    ]
    question = "What did Nadia bake?"
    whole = builder.build(facts, question, recompute=len(facts))
    assert whole.prompt_ids == builder.prompt_injection_ids(facts, question)
    assert [e.key for e in whole.entries] == [builder.prefix_key] and whole.fact_keys == []
    plain = builder.build(facts, question)
    tail = builder.build(facts, question, recompute=1)
    assert tail.prompt_ids == plain.prompt_ids
    assert tail.entries == plain.entries[:-1] and tail.fact_keys == plain.fact_keys[:2]
    # same ids, other KV past the span: the prefix cache must keep them apart
    assert len({plain.cache_salt, tail.cache_salt, whole.cache_salt}) == 3
    result = runtime.engine.generate(tail, max_tokens=1)  # after plain was never sent: loads
    assert result.injected_tokens == tail.span_end and result.refused is None


def test_retrieval_smoke_exact_on_the_cpu_cagra_skipped(minilm, tmp_path):
    unique = retrieval.locomo_texts(DATA)  # the fixture's observations and turns
    assert len(unique) == 128 and len(set(unique)) == len(unique)
    vectors = retrieval.locomo_vectors(DATA, minilm, texts=100, questions=12)
    assert vectors.corpus.shape == (100, 384) and vectors.queries.shape == (12, 384)
    assert "100 of 128 unique texts" in vectors.source["texts"]
    encoder = retrieval.QueryEncoder(lambda text: minilm.embed([text]), "MiniLM", "trained")
    result = retrieval.run_retrieval(
        vectors, [500, 2000], k=50, queries=12, device="cpu", encoder=encoder
    )
    assert "CUDA" in result["skipped"]["cagra"]  # IndexUnavailableError's reason
    assert result["failed"] == {}
    assert [(r["n"], r["index"]) for r in result["rows"]] == [(500, "exact"), (2000, "exact")]
    for row in result["rows"]:
        assert row["recall_at_k"] == row["batch_recall_at_k"] == 1.0  # exact against itself
        assert row["extend_rows"] == row["n"] // 10 and row["build_rows"] == row["n"] * 9 // 10
        assert row["build_s"] > 0 and row["extend_s"] > 0 and row["batch_queries_per_s"] > 0
        assert len(row["search_s"]) == 12
        assert 0 < row["search_s_median"] <= row["search_s_p90"] < 1
        assert row["embed_plus_search_s_median"] > row["search_s_median"]
    embed = result["embed"]
    assert embed["weights"] == "trained" and 0 < embed["s_median"] <= embed["s_p90"]
    real, expanded = result["corpora"]
    assert (real["real_rows"], real["synthetic_rows"]) == (100, 400)
    assert (expanded["real_rows"], expanded["synthetic_rows"]) == (100, 1900)
    assert 0 < expanded["nn_cosine_median"] < 1  # noisy copies: near their seed, not equal
    assert "cagra skipped" in retrieval.headline(result)
    retrieval.plot(result, tmp_path / "retrieval.png")
    write_json(result, tmp_path / "retrieval.json")

    # The GPU machine's way: exported vectors, MiniLM's config and tokenizer without weights.
    npz = tmp_path / "vectors.npz"
    retrieval.save_vectors(vectors, npz)
    assert retrieval.copy_minilm_config(minilm.model_dir, retrieval.minilm_config_dir(npz)) < 1e6
    assert torch.allclose(retrieval.load_vectors(npz).corpus, vectors.corpus, atol=1e-6)
    out = tmp_path / "gpu-like"
    retrieval.main([str(out), "--vectors", str(npz), "--sizes", "300", "--queries", "4"])
    saved = json.loads((out / "retrieval.json").read_text())
    assert saved["embed"]["weights"] == "random" and saved["embed"]["s_median"] > 0
    assert saved["rows"][0]["recall_at_k"] == 1.0 and saved["device"] == "cpu"
    assert saved["command"].startswith("python -m bench.retrieval")


def test_minilm_forward_computes_what_the_embedder_does():
    """The embed timing's transformers-only path is the product's computation (in float32:
    the product may run MiniLM in bfloat16 on this CPU, see test_embedder.py)."""
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.model_files import minilm_dir

    texts = ["What did Nadia bake?", "Tomas adopted a beagle mix from the shelter in 2023."]
    forward = retrieval.MiniLMForward(minilm_dir(), torch.device("cpu"))
    assert forward.trained
    ours = torch.cat([forward(text) for text in texts])  # [2, 384]
    theirs = SentenceTransformerEmbedder(dtype="float32").embed(texts)  # [2, 384]
    assert torch.allclose(ours, theirs, atol=1e-5)


class _EngineSource:
    """The session engine as the step anatomy's suite: k facts of the pool, one-token TTFT."""

    def __init__(self, engine, facts) -> None:
        self.engine, self.facts, self.tags = engine, facts, itertools.count()

    def request(self, k: int):
        composed, _ = self.facts.pair(list(range(k)), f"anatomy {next(self.tags)}")
        return composed

    def _ttft(self, prompt):
        result = self.engine.generate(prompt, max_tokens=1)
        return result.ttft_s, result


def test_step_anatomy_smoke(runtime, facts, tmp_path):
    source = _EngineSource(runtime.engine, facts)
    result = step_anatomy.run(source, tmp_path, runs=2, small=1, large=2, profiled_runs=2)
    modes = {"k0", "query0", "k1", "k2", "warm2"}
    assert set(result["ttft_ms"]) == set(result["ttft_ms_after"]) == modes
    assert all(ms > 0 for ms in result["ttft_ms"].values())
    assert set(result["paired_ratios"]) == {
        "query0/k0", "k1/k0", "k2/k0", "warm2/k0", "k1/query0", "k2/query0", "warm2/query0",
        "k2/k1", "warm2/k1", "warm2/k2",
    }  # fmt: skip
    assert all(r > 0 for r in result["paired_ratios"].values())
    connector = result["connector_us"]
    for mode in ("k1", "k2"):  # both sides timed from outside on every injected request
        parts = connector[mode]
        assert parts["scheduler_us"] > 0 and parts["load_us"] > 0
        assert parts["load_us"] < result["ttft_ms"][mode] * 1e3
    assert "load_us" not in connector["warm2"]  # all in vLLM's prefix cache: nothing loaded
    assert "load_us" not in connector["query0"]  # no kv params: nothing to load
    phases = result["vllm_us"]
    assert phases["missing"] == []  # every phase of VLLM_PHASES is found on this vLLM
    for mode in modes:  # inclusive times: each phase holds the ones it calls
        p = phases[mode]
        intake_parts = ("inputs", "output_processor", "request_and_block_hashes", "scheduler_queue")
        assert 0 < sum(p[f"intake.{part}"] for part in intake_parts) <= p["intake"]
        runner = p["runner.update_states"] + p["runner.prepare_inputs"]
        assert 0 < runner <= p["runner.execute_model"]
        assert 0 < p["schedule"] + p["runner.execute_model"] <= p["step"]
        assert p["schedule.allocate_blocks"] <= p["schedule"]
    probe = result["host_probe"]
    assert "MainThread" in probe["threads"] and probe["numpy_cumsum_50_us"] > 0
    python = result["python_us"]
    for mode in modes:  # the profiler saw vLLM's intake and our scheduler side in every mode
        assert python["phases_us"][mode]["add_request"] > 0
        assert python["phases_us"][mode]["connector_match"] > 0
    assert set(python["growth_over_k0_us"]) == modes - {"k0"}
    if not torch.cuda.is_available():
        assert "skipped" in result["gpu_us"] and "skipped" in result["timeline"]
    text = (tmp_path / "anatomy.txt").read_text()
    assert text.startswith("TTFT without profiler") and "growth over k0, k2" in text
    assert json.loads((tmp_path / "anatomy.json").read_text())["runs"] == 2


def test_summarize_trace_places_the_load_kernel_and_the_host_waits():
    """A hand-made chrome trace: one request span, a forward scope, the load kernel, two forward
    kernels with an idle gap, a host wait, and a kernel outside the span that must not count."""

    def x(name, cat, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    events = [
        x("request k50 0", "user_annotation", 1000.0, 500.0),
        x("gpu_model_runner: forward", "user_annotation", 1100.0, 300.0),
        x("cudaStreamSynchronize", "cuda_runtime", 1400.0, 40.0),
        x("_inject_kernel", "kernel", 1050.0, 20.0),
        x("gemm", "kernel", 1080.0, 30.0),  # 10 us after the load kernel ends
        x("attention", "kernel", 1150.0, 50.0),  # 40 us idle before it
        x("gemm", "kernel", 2000.0, 30.0),  # after the span
    ]
    (row,) = summarize_trace(events)
    assert row["name"] == "request k50 0" and row["wall_us"] == 500.0
    assert row["first_gpu_us"] == 50.0 and row["last_gpu_end_us"] == 200.0
    assert row["gpu_busy_us"] == 100.0 and row["gpu_idle_between_us"] == 50.0
    assert row["kernels"] == 3
    assert row["load_kernel"] == {"start_us": 50.0, "us": 20.0, "next_kernel_gap_us": 10.0}
    assert row["host_waits_us"] == {"cudaStreamSynchronize": 40.0}
    assert row["scopes_us"] == {"gpu_model_runner: forward": 300.0}
