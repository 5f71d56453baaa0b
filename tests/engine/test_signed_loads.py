"""With a server's request key, the connector loads and captures only what the server signed:
a request naming another user's entries with their exact token ids loads nothing."""

from __future__ import annotations

import pytest

from inferscale_core.prompt_builder import MemoryFact
from inferscale_core.request_signing import sign
from inferscale_core.vllm_plugin import engine_requests

KEY = bytes(range(32))
FACTS = [MemoryFact("Ana's locker code is 4417."), MemoryFact("Ana lives in Porto.")]


@pytest.fixture
def keyed(runtime, monkeypatch):
    """The live scheduler requires signatures with KEY (as under `serve`); the engine signs
    with it (the server's requests, encodings included) until a test forges one."""
    core = runtime.engine.llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler.connector._scheduler
    monkeypatch.setattr(scheduler, "request_key", KEY)
    monkeypatch.setattr(runtime.engine, "request_key", KEY)
    return runtime


def test_signed_params_load(keyed, monkeypatch):
    ana = keyed.builder.scoped("ana-secret")
    composed = ana.build(FACTS, "What is Ana's locker code?")
    result = keyed.engine.generate(composed, max_tokens=2)
    assert result.refused is None and result.injected_tokens > 0


def test_unsigned_params_naming_another_users_entries_load_nothing(keyed, monkeypatch):
    # The exact entries and token ids of ana's request, sent without the server's signature.
    composed = keyed.builder.scoped("ana-secret").build(FACTS, "What is Ana's locker code?")
    monkeypatch.setattr(keyed.engine, "request_key", None)
    result = keyed.engine.generate(composed, max_tokens=2)
    assert result.injected_tokens == 0 and "not signed" in result.refused
    assert result.computed_tokens == result.prompt_tokens  # every token prefilled, none loaded


def test_signed_params_replayed_under_another_salt_load_nothing(keyed, monkeypatch):
    ana_salt = keyed.builder.scoped("ana-secret").cache_salt(20)
    composed = keyed.builder.scoped("bo-secret").build(FACTS, "What is Ana's locker code?")
    monkeypatch.setattr(  # signed for ana's salt, whatever salt the request goes with
        engine_requests, "sign", lambda ours, key, salt: sign(ours, key, ana_salt)
    )
    result = keyed.engine.generate(composed, max_tokens=2)
    assert result.injected_tokens == 0 and "wrong signature" in result.refused
