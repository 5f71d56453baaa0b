"""The disk budget on the real engine (issue 34): 200 facts in a store over a budget of 50
entries. The worker drops the least recently injected KV down under it, files and rows; no
fact is lost; a dropped fact that is asked about goes in as text and is encoded again."""

from __future__ import annotations

import random

import pytest

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.memory_worker import EVICT_TO
from inferscale_core.session import INJECTED, REENCODING, SessionConfig

pytestmark = pytest.mark.engine

N_FACTS = 200
BUDGET_ENTRIES = 50


def _names(n: int) -> list[str]:
    """Made-up one-word names: each fact is found by its own word."""
    rng, names = random.Random(34), set()
    while len(names) < n:
        names.add("".join(rng.choice("bdgklmnprstvz") + rng.choice("aeiou") for _ in range(3)))
    return sorted(names)


def test_a_store_over_its_budget_keeps_to_it_and_loses_no_fact(runtime, minilm, tmp_path):
    store = runtime.store
    before = set(store.keys())  # the session's other tests share the store's folder
    session = wiring.open_session(
        runtime,
        AppConfig(kv_disk_budget="off"),
        tmp_path / "memory.db",
        embedder=minilm,
        extractor=DeterministicExtractor(),
        session_config=SessionConfig(k=4, w=0, max_tokens=4, history_turns=0),
    )
    try:
        worker, log, pid = session.worker, session.factlog, session.profile_id
        names = _names(N_FACTS)
        texts = {name: f"The locker code of {name} is {i:03d}." for i, name in enumerate(names)}
        for text in texts.values():
            session.remember(text)
        assert worker.wait_idle(timeout=600), worker.stats
        assert worker.stats.errors == 0, worker.stats.last_error
        fingerprint = runtime.fingerprint
        rows = log.db.execute(
            "SELECT location FROM kv_entries WHERE model_fingerprint = ?", (fingerprint,)
        ).fetchall()
        assert len(rows) == N_FACTS
        sizes = {key: store.path(key).stat().st_size for (key,) in rows}
        budget = BUDGET_ENTRIES * max(sizes.values())

        # a reply just injected some: they are the most recently used, spared
        recent = session.ask_all(None, f"What is the locker code of {names[0]}?", log=False)
        used = [f.fact_id for f in recent.facts if f.how == INJECTED]
        assert used

        worker.disk_budget = budget
        assert worker.wait_idle(timeout=120), worker.stats
        assert worker.stats.errors == 0, worker.stats.last_error
        recorded = log.kv_bytes(fingerprint)
        assert recorded <= EVICT_TO * budget
        keys = log.kv_keys_for(list(range(1, N_FACTS + 1)), fingerprint, 0, session.encoding)
        assert set(used) <= set(keys)  # the least recently used went, not these
        new_files = set(store.keys()) - before
        assert set(keys.values()) <= new_files  # every row's file is there
        assert sum(store.path(key).stat().st_size for key in new_files) <= budget
        evicted = N_FACTS - len(keys)
        assert worker.stats.evicted == evicted >= N_FACTS - BUDGET_ENTRIES
        assert worker.stats.deferred == evicted == log.deferred_kv(pid)["evicted"]
        assert worker.stats.pending_facts == 0  # deferred: not encoded again unasked
        assert sorted(f.text for f in log.active_facts(pid)) == sorted(texts.values())

        # asked about, a dropped fact goes in as text and is encoded again in the background
        fact_id = max(i for i in range(1, N_FACTS + 1) if i not in keys)
        gone = names[fact_id - 1]  # ids follow the order the facts were told in
        assert log.get_fact(fact_id).text == texts[gone]
        reply = session.ask_all(None, f"What is the locker code of {gone}?", log=False)
        how = {f.fact_id: f.how for f in reply.facts}
        assert how[fact_id] == REENCODING, reply.facts
        assert worker.wait_idle(timeout=120), worker.stats
        assert log.kv_key(fact_id, fingerprint, 0, session.encoding) is not None
        assert fact_id not in log.deferred_facts(pid)
        again = session.ask_all(None, f"What is the locker code of {gone}?", log=False)
        assert {f.fact_id: f.how for f in again.facts}[fact_id] == INJECTED
        assert log.kv_bytes(fingerprint) <= budget
    finally:
        session.close()
