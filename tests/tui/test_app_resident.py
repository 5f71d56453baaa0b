"""The open app serves its desk: ``ask`` from the shell answers through the app's engine and
memory (no engine of its own), and what each is told, the other injects next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.tui.app import AssistantApp
from app.tui.widgets.prompt import PromptInput
from app.tui.widgets.transcript import ChatMessage
from inferscale_core import paths, wiring
from inferscale_core.config import AppConfig
from inferscale_core.desk_socket import socket_path
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.session import SessionConfig

pytestmark = [pytest.mark.engine, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
SIZE = (120, 40)


async def _until(pilot, condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def _ask(*args: str) -> tuple[dict, float]:
    """``inferscale-assistant ask --json ARGS``; its report and wall time."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "app", "ask", "--json", *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""  # only the answer: no engine noise, no engine at all
    return json.loads(done.stdout), wall


async def test_ask_answers_through_the_open_app_and_each_injects_the_others_facts(
    runtime, minilm, tmp_path, monkeypatch
):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))  # the app's and ask's home
    db = paths.memory_db()

    def open_session(on_step):
        return wiring.open_session(
            runtime,
            AppConfig(k=5, w=2),
            db,
            embedder=minilm,
            extractor=DeterministicExtractor(),
            session_config=SessionConfig(k=5, w=2, max_tokens=12, history_turns=2, recompute=0),
        )

    app = AssistantApp(
        AppConfig(k=5, w=2, recompute=0),
        open_session,
        db_path=db,
        config_path=paths.config_file(),
        inbox=tmp_path / "inbox",
        import_root=tmp_path,
    )
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.desk_server is not None, what="the desk served")
            assert app.desk_server.path == socket_path(db, "default")

            # told through ask: remembered (encoded) before ask exits, injected in the app
            told, wall = _ask("My neighbour Rui repairs old valve radios in his garage.")
            assert told["remembered"] is True and told["answer"]
            print(f"ask through the app: {wall:.2f} s wall")
            prompt = app.chat.query_one("#prompt", PromptInput)
            prompt.focus()
            prompt.value = "Who repairs old valve radios?"
            await pilot.press("enter")
            await _until(pilot, lambda: app.chat.answering is None and app.chat.query(ChatMessage))
            await _until(pilot, lambda: app.chat.answering is None, what="the app's reply")
            reply = app.chat.query(ChatMessage).last().reply
            assert reply is not None
            rui = [f for f in reply.facts if "Rui" in f.text]
            assert rui and rui[0].how == "injected", reply.facts

            # told in the app: ask injects it
            prompt.focus()
            prompt.value = "My daughter Leonor started judo classes on Tuesdays."
            await pilot.press("enter")
            await _until(pilot, lambda: app.chat.answering is None, what="the second reply")
            told_in_app = app.chat.query(ChatMessage).last().reply
            turns = [told_in_app.user_turn_id, told_in_app.assistant_turn_id]
            assert app.host.wait_remembered([t for t in turns if t], timeout_s=120)
            asked, _ = _ask("--no-log", "When are Leonor's judo classes?")
            leonor = [f for f in asked["facts"] if "Leonor" in f["text"]]
            assert leonor and leonor[0]["how"] == "injected", asked["facts"]
            assert leonor[0]["id"] in asked["injected_fact_ids"]
            log_turns = await app.read(lambda log, pid: log.conversations(pid))
            assert "shell" in [c.source for c in log_turns]  # ask logged into the app's memory
        assert app.desk_server is None and not socket_path(db, "default").exists()
    finally:
        app.host.close()
