"""``ask`` refuses an empty question before anything starts (no config read, no engine)."""

from __future__ import annotations

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
