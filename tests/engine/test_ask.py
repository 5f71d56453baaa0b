"""``ask`` is the assistant from the shell, on the session's engine (passed in, as the chat's
opener gets it): what it is told is remembered in the profile's "shell" conversation and
injected, as KV, into a later ``ask``; ``--no-log`` writes nothing, ``--no-memory`` uses none."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from rich.console import Console

from app.commands.ask import SHELL, AskOptions, run_ask
from inferscale_core import paths
from inferscale_core.config import AppConfig
from inferscale_core.factlog import FactLog

pytestmark = pytest.mark.engine

TOLD = "My sister Ines moved to Lisbon in March 2024."
ASKED = "Where does my sister live?"


def _ask(
    runtime, question: str, *facts: str, config: AppConfig | None = None, **options
) -> tuple[int, dict | None, str]:
    """``ask --json`` in-process: (exit code, its JSON report, what it wrote to stderr). The
    config's r is 0 unless given: every hit is then injected, the path these tests follow."""
    options = {"max_tokens": 12, "as_json": True, **options}
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_ask(
            question,
            [(fact, None) for fact in facts],
            config=config or AppConfig(recompute=0),
            options=AskOptions(**options),
            console=Console(file=err, width=100),
            assistant=runtime,
        )
    lines = out.getvalue().strip().splitlines()
    return code, json.loads(lines[-1]) if lines else None, err.getvalue()


def _log_state() -> tuple:
    """Everything ``--no-log`` must leave alone: conversations, turns, facts, KV rows."""
    with FactLog.open(paths.memory_db()) as log:
        pid = log.profile("default")
        conversations = [(c.id, c.title, c.source, c.turns) for c in log.conversations(pid)]
        facts = [(f.id, f.text, f.status) for f in log.active_facts(pid)]
        return conversations, log.turns(pid), facts, log.extraction_cursor(pid)


@pytest.fixture(scope="module")
def told(runtime, tmp_path_factory):
    """A fresh data folder whose memory was told TOLD through ``ask``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.HOME_ENV, str(tmp_path_factory.mktemp("ask-home")))
        code, report, err = _ask(runtime, TOLD, remember_timeout_s=300)
        assert code == 0, err
        yield report


def test_a_fact_told_to_ask_is_injected_into_the_next_ask(runtime, told):
    assert told["remembered"] is True
    assert told["facts"] == []  # nothing was known yet
    code, report, err = _ask(runtime, ASKED)
    assert code == 0, err
    lisbon = [f for f in report["facts"] if "Lisbon" in f["text"]]
    assert len(lisbon) == 1, report["facts"]
    fact = lisbon[0]
    assert fact["how"] == "injected", report  # its KV, not pasted as text
    assert isinstance(fact["id"], int) and fact["id"] in report["injected_fact_ids"]
    assert fact["date"] and fact["score"] > 0 and fact["tier"]
    assert report["injected_tokens"] > 0 and report["mode"] == "inject"
    assert report["conversation_id"] == told["conversation_id"]  # one shell conversation
    with FactLog.open(paths.memory_db()) as log:
        shell = [c for c in log.conversations(log.profile("default")) if c.source == SHELL]
        assert [(c.title, c.turns) for c in shell] == [(SHELL, 4)]
    # the default r=4: the best hits go in as text after the injected ones, with the question
    code, report, err = _ask(runtime, ASKED, config=AppConfig(), log=False)
    assert code == 0, err
    assert [f["how"] for f in report["facts"] if "Lisbon" in f["text"]] == ["recomputed"]


def test_no_log_uses_the_memory_and_leaves_the_log_unchanged(runtime, told):
    before = _log_state()
    code, report, err = _ask(runtime, "My brother Tomas lives in Porto. " + ASKED, log=False)
    assert code == 0, err
    assert _log_state() == before
    assert report["remembered"] is None and report["conversation_id"] is None
    assert [f["how"] for f in report["facts"] if "Lisbon" in f["text"]] == ["injected"]


def test_no_memory_lists_no_facts(runtime, told):
    code, report, err = _ask(runtime, ASKED, memory=False, remember_timeout_s=0)
    assert code == 0, err
    assert report["facts"] == [] and report["injected_fact_ids"] == []


def test_prompt_injection_sends_the_memory_as_text(runtime, told):
    code, report, err = _ask(runtime, ASKED, prompt_injection=True, remember_timeout_s=0)
    assert code == 0, err
    assert report["mode"] == "prompt" and report["injected_tokens"] == 0
    assert [f["how"] for f in report["facts"] if "Lisbon" in f["text"]] == ["text"]


def test_fact_answers_with_ad_hoc_memories_only(runtime, told):
    before = _log_state()
    code, report, err = _ask(runtime, "What is my cat called?", "I adopted a cat named Miso.")
    assert code == 0, err
    assert [(f["text"], f["how"]) for f in report["facts"]] == [
        ("I adopted a cat named Miso.", "injected")
    ]
    assert _log_state() == before


@pytest.mark.parametrize("log", [False, True], ids=["no-log", "session"])
def test_a_question_longer_than_the_context_is_one_line(runtime, tmp_path, monkeypatch, log):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path))
    question = "Tell me about tea. " * 1200  # ~6k tokens, the engine takes 4096
    code, report, err = _ask(runtime, question, log=log, remember_timeout_s=0)
    assert code == 2 and report is None
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    code, report, err = _ask(runtime, question, "2024-03-01 I keep bees.", log=log)  # --fact
    assert code == 2 and report is None and err.startswith("error: the message is "), err


def test_after_a_move_the_new_home_is_the_best_hit_and_the_old_one_says_until(
    runtime, tmp_path, monkeypatch
):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    for told in ("I live in Lisbon with my partner.", "We moved to Porto with the kids."):
        code, report, err = _ask(runtime, told, remember_timeout_s=300)
        assert code == 0 and report["remembered"] is True, err
    code, report, err = _ask(runtime, "Where do I live?", log=False)
    assert code == 0, err
    texts = [f["text"] for f in report["facts"]]  # best last
    assert texts[-1] == "We moved to Porto with the kids.", texts
    assert texts.index("I live in Lisbon with my partner.") < len(texts) - 1
    with FactLog.open(paths.memory_db()) as log:
        pid = log.profile("default")
        lisbon = next(f for f in log.active_facts(pid) if "Lisbon" in f.text)
        assert lisbon.valid_until is not None and lisbon.ended_by is not None
    # a question about the past is not steered to the current home
    code, report, err = _ask(runtime, f"Where did I live in {lisbon.valid_until.year - 1}?")
    assert code == 0, err
    assert "Lisbon" in report["facts"][-1]["text"], report["facts"]
