"""Quarantine reasons are read by people: each says what is wrong with the file and what to do.

The first line is what the import screen and ``watch`` show, so it carries both; no developer
API (``parse_file``, ``fmt=``) and no raw ``[Errno …]`` text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inferscale_core.importers.pipeline import REASON_SUFFIX, Importer

BROKEN = {
    "conversations.json": ('[{"mapping": {"n1": {"message": null, "parent": null}}, ', "ChatGPT"),
    "claude.json": (json.dumps([{"uuid": "c1", "chat_messages": [{"text": "hi"}]}]), "Claude"),
    "chat.jsonl": ('{"role": "user", "content": "hi"}\n{not json\n', "JSON Lines"),
    "notes.txt": ("Just some thoughts about the weekend.\nNothing like a chat here.\n", None),
    "empty.jsonl": ("", None),
}


@pytest.fixture
def report(log, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name, (content, _) in BROKEN.items():
        (inbox / name).write_text(content, encoding="utf-8")
    return Importer(log, log.profile(), inbox).import_path(inbox), inbox


def _first(reason: str | None) -> str:
    assert reason
    return reason.splitlines()[0]


def test_every_reason_says_what_is_wrong_and_what_to_do(report):
    report, inbox = report
    by_name = {f.path.name: f for f in report.files}
    assert {n for n, f in by_name.items() if f.status == "quarantined"} == set(BROKEN)
    for name, (_, fmt) in BROKEN.items():
        reason = by_name[name].reason
        first = _first(reason)
        assert "parse_file" not in reason and "fmt=" not in reason
        if fmt is None:
            assert "not a supported chat export" in first
            assert "conversations.json" in first and "JSON Lines" in first  # what to import
        else:
            assert f"malformed {fmt} export" in first
            assert "import the" in first.lower()  # again, fixed or freshly exported
        saved = (inbox / "quarantine" / f"{name}{REASON_SUFFIX}").read_text(encoding="utf-8")
        assert reason in saved
    assert "the file is empty" in _first(by_name["empty.jsonl"].reason)
    assert "Export your data again from ChatGPT" in by_name["conversations.json"].reason
    assert "Correct that line in a text editor" in by_name["chat.jsonl"].reason


def test_an_unreadable_file_says_why_and_what_to_check(log, tmp_path: Path):
    importer = Importer(log, log.profile(), tmp_path / "inbox")
    (gone,) = importer.import_path(tmp_path / "gone.json").files
    first = _first(gone.reason)
    assert "could not be read (No such file or directory)" in first
    assert "[Errno" not in first and "Check that it exists" in first
    if os.geteuid() != 0:  # root reads files whatever their mode
        locked = tmp_path / "locked.jsonl"
        locked.write_text('{"role": "user", "content": "hi"}\n', encoding="utf-8")
        locked.chmod(0)
        (result,) = importer.import_path(locked).files
        assert "could not be read (Permission denied)" in _first(result.reason)
