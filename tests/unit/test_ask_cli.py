"""``ask`` refuses an empty question before anything starts (no config read, no engine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app import cli
from app.commands import ask


@pytest.mark.parametrize("question", ["", "   \n\t"])
def test_empty_question_is_one_line_exit_2_and_no_engine(question, monkeypatch, capsys):
    def no_engine(*args, **kwargs):
        raise AssertionError("the engine must not start for an empty question")

    monkeypatch.setattr("app.startup.open_assistant", no_engine)
    monkeypatch.setattr("inferscale_core.wiring.build", no_engine)
    assert cli.main(["ask", question]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [f"error: {ask.EMPTY_QUESTION}"]


def test_help_says_ask_remembers_and_how_to_opt_out(capsys):
    with pytest.raises(SystemExit):
        cli.main(["ask", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("shell", "remembering", "--no-log", "--no-memory", "--remember-timeout"):
        assert words in text


def test_an_overlong_question_is_refused_before_any_engine(smollm2_path, monkeypatch, capsys):
    def no_engine(*args, **kwargs):
        raise AssertionError("the engine must not start for a question that cannot fit")

    monkeypatch.setattr("app.startup.open_assistant", no_engine)
    monkeypatch.setattr("inferscale_core.wiring.build", no_engine)
    assert cli.main(["ask", "Tell me about tea. " * 5000]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert len(out.err.splitlines()) == 1 and out.err.startswith("error: the message is "), out.err


def test_quiet_stderr_keeps_only_the_commands_own_lines():
    """Third-party writes to fd 2, from Python, C and child processes alike, are dropped."""
    script = """
import os, subprocess, sys, warnings
from app.startup import quiet_stderr
with quiet_stderr() as real:
    warnings.warn("a FutureWarning", FutureWarning)
    print("a log line", file=sys.stderr)
    os.write(2, b"NUMA binding\\n")
    subprocess.run(["sh", "-c", "echo Loading checkpoint shards >&2"], check=True)
    print("error: the one line", file=real)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stderr == "error: the one line\n" and done.stdout == ""
