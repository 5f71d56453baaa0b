"""After a model switch: how many memories have KV for the model in use, and how many wait."""

from __future__ import annotations

from inferscale_core.factlog import FactLog


def test_coverage_counts_a_switch_by_model_window_and_encoder(tmp_path):
    with FactLog.open(tmp_path / "memory.db") as log:
        profile = log.profile("default")
        other = log.profile("work")
        ids = [log.add_fact(profile, f"Fact {i}: shelf {i}.")[0] for i in range(5)]
        log.add_fact(other, "Another profile's fact.")
        for fact_id in ids:
            log.record_kv(fact_id, "old", 0, "v1", f"old-{fact_id}", 10, 100)
        assert log.kv_coverage(profile, "old", 0, "v1") == (5, 5, 0)
        # the new model: every memory has KV, but not for it
        assert log.kv_coverage(profile, "new", 0, "v1") == (5, 0, 5)
        assert log.facts_encoded_for(profile, "new") == 0
        for fact_id in ids[:2]:
            log.record_kv(fact_id, "new", 0, "v1", f"new-{fact_id}", 10, 100)
        assert log.kv_coverage(profile, "new", 0, "v1") == (5, 2, 3)
        assert log.facts_encoded_for(profile, "new") == 2
        # another window of the same model is another encoding
        assert log.kv_coverage(profile, "new", 20, "v1+anchored") == (5, 0, 5)
        log.forget_fact(ids[4], "test")
        assert log.kv_coverage(profile, "new", 0, "v1") == (4, 2, 2)
        assert log.kv_coverage(other, "new", 0, "v1") == (1, 0, 0)  # nothing to re-encode
