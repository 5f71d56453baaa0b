"""``bench import`` end to end on the session engine: a small export dropped into the inbox of
each mode, eager (every fact encoded) and lazy (old turns' facts deferred)."""

from __future__ import annotations

import json

import pytest

from bench import import_time
from inferscale_core.config import AppConfig
from inferscale_core.session import HOWS

pytestmark = pytest.mark.engine


def test_the_export_is_a_jsonl_log_of_unique_dated_statements(tmp_path):
    said = import_time.statements(200, 100, 30, seed=3)
    assert said == import_time.statements(200, 100, 30, seed=3)
    assert len({s.name for s in said}) == 200 and [s.when for s in said] == sorted(
        s.when for s in said
    )
    assert 0 < sum(s.recent for s in said) < 200
    path = import_time.write_export(tmp_path / "x.jsonl", said)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["speaker"] for r in rows} == set(import_time.SPEAKERS)
    probes = import_time.choose_probes(said, 6, seed=3)
    assert sum(p.recent for p in probes) == 3 and all(p.name in p.text for p in probes)


def test_a_mode_stopped_by_its_limit_is_extrapolated_from_its_wall_time_rates():
    """The worker extracts every turn before it encodes: the facts left are projected at the
    rate encoding kept in wall time after extraction ended (an H100's eager row, 7db4939:
    6,912 of 9,999 facts at 420.5 s, extraction done at 175.3 s), not at its batches' rate
    (44.1 facts/s, which leaves out the log's work between batches) nor as if encoding had
    run beside extraction (which gave 336.9 s, before the wall time it had already taken)."""
    said = import_time.statements(10_000, 1095, 30, seed=0)
    row = {"mode": "eager", "turns_extracted": 10_000, "facts": 9_999}
    row["encode_rate_facts_per_s"] = 44.1
    marks = {"imported_s": 1.2, "extracted_s": 175.34, "usable_s": None}
    out = import_time._extrapolate(row, marks, said, 420.48, 6_912)
    rate = 6_912 / (420.48 - 175.34)  # 28.2 facts/s
    assert out["extrapolated"] and out["fully_encoded_s"] == round(420.48 + 3_087 / rate, 1)
    # extraction not over at the limit: turns at their wall rate, then the batches' rate
    marks = {"imported_s": 1.0, "extracted_s": None, "usable_s": None}
    row = {"mode": "eager", "turns_extracted": 5_000, "facts": 5_000}
    row["encode_rate_facts_per_s"] = 10.0
    out = import_time._extrapolate(row, marks, said, 101.0, 0)
    assert out["usable_s"] == 201.0 and out["fully_encoded_s"] == round(201.0 + 1_000.0, 1)


def test_import_bench_eager_encodes_all_lazy_defers_the_old(runtime, minilm, tmp_path):
    # w=0: a quick encode on this CPU; recompute=0: the best hit injected when it can be
    config = AppConfig(w=0, kv_disk_budget="off", recompute=0)
    result = import_time.run_import(
        runtime,
        config,
        tmp_path,
        turns=40,
        days=100,
        probes=6,
        limit=120,
        max_tokens=2,
        poll=0.2,
        embedder=minilm,
    )
    assert result["bench"] == "import" and result["settings"]["recent_days"] == 30
    recent = result["export"]["recent_turns"]
    eager, lazy = result["rows"]
    assert (eager["mode"], lazy["mode"]) == ("eager", "lazy")
    for row in (eager, lazy):
        assert row["worker_errors"] == 0 and not row["extrapolated"], row
        assert row["facts"] == 40 and row["turns_extracted"] == 40
        assert 0 < row["imported_s"] <= row["extracted_s"] <= row["usable_s"]
        assert row["extracted_s"] <= row["fully_encoded_s"] <= row["wall_s"]
        assert row["kv_disk_bytes"] > 0 and row["encoded"] * 1000 < row["kv_disk_bytes"]
        assert len(row["probes"]) == 6 and row["probes_answered_from_memory"] == 6
        assert {p["used"] for p in row["probes"]} <= set(HOWS)
    assert eager["deferred"] == 0 and eager["encoded"] == 40
    assert lazy["deferred"] == 40 - recent and lazy["encoded"] == recent
    # the old probes' facts were never encoded: they went in as text (or the best hits)
    assert all(p["used"] != "injected" for p in lazy["probes"] if not p["recent"])
    assert any(p["used"] == "injected" for p in eager["probes"] if not p["recent"])
    assert import_time.headline(result).startswith("import of 40 turns: eager: usable")
