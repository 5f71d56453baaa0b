"""Encode what will be used (issue 34): an imported conversation's old turns give facts whose
encoding waits until they are first retrieved; its recent turns are encoded at once. The
real engine, the deterministic extractor, a small JSON Lines export."""

from __future__ import annotations

import json

import pytest

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.factlog import FactLog
from inferscale_core.importers.pipeline import Importer
from inferscale_core.session import INJECTED, TEXT, SessionConfig

pytestmark = pytest.mark.engine

OLD = {  # more than 30 days before the conversation's last turn
    "2023-01-10T09:00:00Z": "I adopted a grey cat named Miso from the shelter.",
    "2023-02-14T09:00:00Z": "My sister Ana moved to Lisbon for a job in biotech.",
    "2023-04-02T09:00:00Z": "I ran my first half marathon in 1 hour 52 minutes.",
}
RECENT = {  # within 30 days of it
    "2023-06-01T09:00:00Z": "I started learning the cello last spring.",
    "2023-06-20T09:00:00Z": "My best friend Jun lives in Osaka and teaches chemistry.",
}


def _export(tmp_path):
    path = tmp_path / "export.jsonl"
    rows = [
        {"role": "user", "content": text, "timestamp": when, "conversation_id": "c1"}
        for when, text in sorted({**OLD, **RECENT}.items())
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _import(db, tmp_path) -> int:
    with FactLog.open(db) as log:
        pid = log.profile("default")
        report = Importer(log, pid, tmp_path / "inbox").import_path(_export(tmp_path))
        assert report.turns_added == len(OLD) + len(RECENT), report
    return pid


def _by_text(log: FactLog, pid: int) -> dict[str, int]:
    return {f.text: f.id for f in log.active_facts(pid)}


def test_old_imported_facts_wait_until_retrieved(runtime, minilm, tmp_path):
    db = tmp_path / "memory.db"
    pid = _import(db, tmp_path)
    session = wiring.open_session(
        runtime,
        AppConfig(kv_disk_budget="off"),  # kv_encode_recent_days: the default, 30
        db,
        embedder=minilm,
        extractor=DeterministicExtractor(),
        session_config=SessionConfig(k=2, w=0, max_tokens=4, history_turns=0),
    )
    try:
        worker, log = session.worker, session.factlog
        assert worker.wait_idle(timeout=300), worker.stats
        assert worker.stats.errors == 0, worker.stats.last_error
        facts = _by_text(log, pid)
        old = {text: i for text, i in facts.items() if any(t[:20] in text for t in OLD.values())}
        assert len(old) == len(OLD) and len(facts) == len(OLD) + len(RECENT), facts
        keys = log.kv_keys_for(list(facts.values()), runtime.fingerprint, 0, session.encoding)
        assert set(keys) == set(facts.values()) - set(old.values())  # the recent, encoded
        assert log.deferred_facts(pid, "import") == sorted(old.values())
        assert worker.stats.deferred == len(OLD) and worker.stats.pending_facts == 0
        # a fact told in a chat now is encoded at once, whatever the imports' dates
        told = session.remember("My favourite food is mushroom risotto.")
        assert worker.wait_idle(timeout=120)
        assert log.kv_key(told.id, runtime.fingerprint, 0, session.encoding) is not None

        (cat,) = [i for text, i in old.items() if "Miso" in text]
        reply = session.ask_all(None, "What is the name of my grey cat Miso?", log=False)
        assert {f.fact_id: f.how for f in reply.facts}[cat] == TEXT  # never encoded yet
        assert cat not in log.deferred_facts(pid)  # queued by the retrieval
        assert worker.wait_idle(timeout=120)
        assert log.kv_key(cat, runtime.fingerprint, 0, session.encoding) is not None
        again = session.ask_all(None, "What is the name of my grey cat Miso?", log=False)
        assert {f.fact_id: f.how for f in again.facts}[cat] == INJECTED
        retrieved = {f.fact_id for f in reply.facts}
        assert set(log.deferred_facts(pid)) == set(old.values()) - retrieved  # the rest wait
    finally:
        session.close()


def test_import_encode_encodes_everything_now(runtime, minilm, tmp_path):
    """What ``import --encode`` runs (``encode_all``): no imported fact is left waiting, those
    a background run deferred included; ``kv_encode_recent_days = "all"`` defers none."""
    db = tmp_path / "memory.db"
    pid = _import(db, tmp_path)
    embedder = minilm
    config = AppConfig(kv_disk_budget="off")
    lazy = wiring.memory_worker(runtime, config, db, embedder=embedder, poll_seconds=0.2)
    assert lazy.start().wait_idle(timeout=300), lazy.stats
    lazy.stop()
    with FactLog.open(db) as log:
        assert len(log.deferred_facts(pid, "import")) == len(OLD)
    eager = wiring.memory_worker(
        runtime, config, db, embedder=embedder, poll_seconds=0.2, encode_all=True
    )
    assert eager.start().wait_idle(timeout=300), eager.stats
    eager.stop()
    assert eager.stats.errors == 0, eager.stats.last_error
    with FactLog.open(db) as log:
        facts = _by_text(log, pid)
        encoding = eager.encoding
        assert log.deferred_kv(pid) == {}
        keys = log.kv_keys_for(list(facts.values()), runtime.fingerprint, config.w, encoding)
        assert set(keys) == set(facts.values())

    other = tmp_path / "all"
    other.mkdir()
    db2 = other / "memory.db"
    pid2 = _import(db2, other)
    worker = wiring.memory_worker(
        runtime,
        AppConfig(kv_disk_budget="off", kv_encode_recent_days="all"),
        db2,
        embedder=embedder,
        poll_seconds=0.2,
    )
    assert worker.start().wait_idle(timeout=300), worker.stats
    worker.stop()
    with FactLog.open(db2) as log:
        assert log.deferred_kv(pid2) == {} and len(log.active_facts(pid2)) == len(facts)
