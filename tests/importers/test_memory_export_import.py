"""``memory export`` read back by ``import``: memories move between profiles.

Through the commands, on a real fact log: export profile A, import into B, the facts equal
(text, the day each is about, when it was learnt); a second import adds nothing; a damaged
export adds nothing and is quarantined with its reason.
"""

from __future__ import annotations

import json

import pytest

from app import cli
from inferscale_core import paths
from inferscale_core.factlog import FactLog
from inferscale_core.importers import detect_format
from inferscale_core.importers.pipeline import QUARANTINE_DIR, REASON_SUFFIX


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Profile "home": three active memories (two dated), one forgotten, one replaced."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")
    with FactLog.open(paths.memory_db()) as log:
        pid = log.profile("home")
        log.add_fact(pid, "I adopted a grey cat named Miso", refers_to="2023-05-08")
        log.add_fact(pid, "My sister Ana moved to Lisbon", refers_to="2024-01-15")
        gone, _ = log.add_fact(pid, "My bank PIN is 1234")
        log.forget_fact(gone, "test")
        old, _ = log.add_fact(pid, "I run 5 km a week")
        log.update_fact(old, "I run 10 km a week", "test")
        log.profile("work")
    return tmp_path


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _facts(profile: str) -> list[tuple[str, str | None, str]]:
    with FactLog.open(paths.memory_db()) as log:
        facts = log.active_facts(log.profile(profile))
    return sorted(
        (f.text, f.refers_to.isoformat() if f.refers_to else None, f.created_at.isoformat())
        for f in facts
    )


def test_export_imports_into_another_profile_once(home, capsys):
    export = home / "home-memories.json"
    code, out = _run(capsys, "memory", "--profile", "home", "export", "-o", str(export))
    assert code == 0, out
    assert detect_format(export) == "memories"
    code, out = _run(capsys, "import", str(export), "--profile", "work")
    assert code == 0, out
    assert "3 memories" in out  # the summary says what was added
    assert _facts("work") == _facts("home") and len(_facts("work")) == 3
    assert "My bank PIN is 1234" not in [text for text, _, _ in _facts("work")]
    # the same file again: skipped; a new export of the same memories: nothing added
    code, out = _run(capsys, "import", str(export), "--profile", "work")
    assert code == 0 and "1 skipped" in out
    again = home / "again.json"
    _run(capsys, "memory", "--profile", "home", "export", "-o", str(again))
    data = json.loads(again.read_text())
    data["exported_at"] = "2099-01-01T00:00:00+00:00"  # other bytes, same memories
    again.write_text(json.dumps(data))
    code, out = _run(capsys, "import", str(again), "--profile", "work")
    assert code == 0 and "1 imported" in out and "memories" not in out.split("files:")[-1]
    assert len(_facts("work")) == 3
    with FactLog.open(paths.memory_db()) as log:  # the audit says where they came from
        pid = log.profile("work")
        first = log.active_facts(pid)[0]
        assert "imported from home-memories.json" in log.audit(pid, first.id)[0].cause


def test_a_damaged_export_is_quarantined_and_adds_nothing(home, capsys):
    inbox = paths.inbox_dir()
    inbox.mkdir(parents=True, exist_ok=True)
    export = inbox / "memories.json"
    _run(capsys, "memory", "--profile", "home", "export", "-o", str(export))
    data = json.loads(export.read_text())
    data["facts"][1]["refers_to"] = "last spring"  # the first fact is fine: not added either
    export.write_text(json.dumps(data, indent=2))
    code, out = _run(capsys, "import", str(export), "--profile", "work")
    assert code == 1 and "quarantined" in out
    assert _facts("work") == []
    reason = inbox / QUARANTINE_DIR / f"memories.json{REASON_SUFFIX}"
    text = reason.read_text()
    assert "malformed memory export (facts[1] (id 2))" in text
    assert "'refers_to' is not an ISO date: 'last spring'" in text
    assert "memory export -o FILE" in text  # what to do
    cut = inbox / "cut.json"  # cut short: invalid JSON, with the place
    cut.write_text(export.parent.joinpath(QUARANTINE_DIR, "memories.json").read_text()[:200])
    code, out = _run(capsys, "import", str(cut), "--profile", "work")
    assert code == 1
    text = (inbox / QUARANTINE_DIR / f"cut.json{REASON_SUFFIX}").read_text()
    assert "malformed memory export (line" in text and "invalid JSON" in text
    assert _facts("work") == []
