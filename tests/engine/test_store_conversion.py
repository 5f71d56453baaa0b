"""The memory worker's background conversion (``MemoryWorker._convert_batch``) on the real
engine and a real fact log: entries stored in another scheme than the store writes are
rewritten a batch at a time, with progress in the worker's stats; a paused or stopped
conversion goes on where it was in a new worker; compressed entries are encoded anew."""

from __future__ import annotations

import time

import pytest

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.factlog import FactLog
from inferscale_core.memory_worker import MemoryWorker
from inferscale_core.session import SessionConfig
from tests.support.store_dtype import store_dtype

pytestmark = pytest.mark.engine

N = 6
FACTS = [
    "My neighbour {tag} keeps three goats behind the old mill.",
    "{tag} repaired the tandem bicycle with parts from Antwerp.",
    "The choir that {tag} sings in rehearses on Tuesday nights.",
    "{tag} planted a fig tree on the balcony in April.",
    "My colleague {tag} collects maps of Baltic lighthouses.",
    "{tag} learned to bake sourdough from a bakery in Lyon.",
]


@pytest.fixture
def memory(runtime, minilm, tmp_path, request):
    """A session whose ``N`` facts are encoded in the model's dtype; its own worker stopped,
    so the test's workers are the only ones converting. Fact texts carry the test's name:
    entry keys (profile/fact id, text) never meet another test's in the shared store."""
    assert runtime.store.store_dtype == "model"
    session = wiring.open_session(
        runtime,
        AppConfig(),
        tmp_path / "memory.db",
        embedder=minilm,
        extractor=DeterministicExtractor(),
        session_config=SessionConfig(k=N, w=0, max_tokens=2, recompute=0),
    )
    tag = request.node.name.split("_")[1].capitalize()  # "test_<word>_...": a name
    facts = [session.remember(text.format(tag=tag)) for text in FACTS]
    assert session.worker.wait_idle(timeout=300), session.worker.stats
    session.worker.stop()
    keys = {f.id: _key(session, f.id) for f in facts}
    assert all(runtime.store.stored_scheme(key) == "model" for key in keys.values())
    try:
        yield session, keys, tag
    finally:
        session.close()


def _key(session, fact_id):
    return session.factlog.kv_key(fact_id, session.builder.fingerprint, 0, session.encoding)


def _worker(session, tmp_path, batch_size):
    db = tmp_path / "memory.db"
    return MemoryWorker(
        lambda: FactLog.open(db),
        session.profile_id,
        session.builder,
        session.store,
        DeterministicExtractor(),
        w=0,
        batch_size=batch_size,
        poll_seconds=0.1,
    )


def _injected(session, question):
    reply = session.ask_all(None, question, log=False)
    return {f.fact_id: f.how for f in reply.facts}


def test_converts_model_entries_to_int4_in_the_background(memory, tmp_path):
    session, keys, tag = memory
    store = session.store
    with store_dtype(store, "int4"):
        worker = _worker(session, tmp_path, batch_size=4).start()
        try:
            assert worker.wait_idle(timeout=120), worker.stats
        finally:
            worker.stop()
        assert worker.stats.errors == 0, worker.stats.last_error
        assert (worker.stats.to_convert, worker.stats.converted) == (0, N)
        for key in keys.values():
            assert store.stored_scheme(key) == "int4"
            store.demote([key], "disk")
            assert store.header(key).scheme == "int4"  # the whole file read and checked
        # same keys: the fact log's rows still point at them
        assert {fid: _key(session, fid) for fid in keys} == keys
        how = _injected(session, f"What does {tag} do?")
        assert set(how) == set(keys) and set(how.values()) == {"injected"}, how


def test_a_paused_then_stopped_conversion_resumes_in_a_new_worker(memory, tmp_path, monkeypatch):
    session, keys, _ = memory
    store = session.store
    convert, asked = store.convert, []
    first = _worker(session, tmp_path, batch_size=4)

    def counted(key, scheme=None):
        asked.append(key)
        done = convert(key, scheme)
        if len(asked) == 2 and first._thread is not None:
            first.pause()  # a chat turn starts in the middle of a batch
        return done

    monkeypatch.setattr(store, "convert", counted)
    with store_dtype(store, "int4"):
        first.start()
        deadline = time.monotonic() + 60
        while len(asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # paused: nothing more happens
        assert first.stats.paused
        assert (first.stats.converted, first.stats.to_convert) == (2, N - 2)
        assert len(asked) == 2
        first.stop()  # stopped while paused
        int4 = {key for key in keys.values() if store.stored_scheme(key) == "int4"}
        assert int4 == set(asked)  # whole entries: converted, or not touched

        second = _worker(session, tmp_path, batch_size=4).start()
        try:
            assert second.wait_idle(timeout=120), second.stats
        finally:
            second.stop()
    assert (second.stats.to_convert, second.stats.converted) == (0, N - 2)
    assert sorted(asked[2:]) == sorted(set(keys.values()) - int4)  # only the rest listed
    assert all(store.stored_scheme(key) == "int4" for key in keys.values())


def test_int4_entries_are_encoded_anew_in_the_models_dtype(memory, tmp_path):
    session, keys, tag = memory
    store = session.store
    for key in keys.values():
        assert store.convert(key, "int4")
    worker = _worker(session, tmp_path, batch_size=4).start()  # the store writes "model"
    try:
        assert worker.wait_idle(timeout=300), worker.stats
    finally:
        worker.stop()
    assert worker.stats.errors == 0, worker.stats.last_error
    assert (worker.stats.to_convert, worker.stats.converted) == (0, N)
    for key in keys.values():
        store.demote([key], "disk")
        assert store.header(key).scheme == "model"
    assert {fid: _key(session, fid) for fid in keys} == keys
    how = _injected(session, f"What does {tag} do?")
    assert set(how) == set(keys) and set(how.values()) == {"injected"}, how
