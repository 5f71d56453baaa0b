"""The import pipeline: LoCoMo end to end (our LoCoMo-format fixture), bad files, grown files, a
SIGKILL mid-import."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console
from sqlite_utils import Database

from app.commands.imports import run_import
from inferscale_core.factlog import FactLog
from inferscale_core.factlog.migrations import migrate
from inferscale_core.importers.pipeline import (
    REASON_SUFFIX,
    Importer,
    ProgressEvent,
    file_sha256,
    list_files,
)
from inferscale_core.paths import memory_db
from tests.support import FIXTURES, LOCOMO_FIXTURE, REPO
from tests.support.repo_process import run_python


@pytest.fixture
def locomo_file(tmp_path) -> Path:
    """A copy of the LoCoMo-format fixture outside the inbox: 2 samples, 7 sessions, 78 turns."""
    path = tmp_path / "downloads" / "locomo.json"
    path.parent.mkdir()
    shutil.copyfile(LOCOMO_FIXTURE, path)
    return path


@pytest.fixture
def importer(log, tmp_path):
    return Importer(log, log.profile(), tmp_path / "inbox")


def count(log: FactLog, sql: str, params: tuple = ()) -> int:
    return log.db.execute(sql, params).fetchone()[0]


def jsonl(lines: list[tuple[str, str]], **extra: str) -> str:
    return "".join(
        json.dumps({**extra, "role": who, "content": text}) + "\n" for who, text in lines
    )


def chat(tag: str, n: int, start: int = 0) -> list[tuple[str, str]]:
    return [("user" if i % 2 == 0 else "assistant", f"{tag} message {i}") for i in range(start, n)]


def whatsapp(lines: list[tuple[str, str]], day: int = 1) -> str:
    return "".join(
        f"{day:02d}/03/2024, 10:{i:02d} - {who}: {text}\n" for i, (who, text) in enumerate(lines)
    )


def no_duplicates(log: FactLog) -> bool:
    return not log.db.execute(
        "SELECT conversation_id, idx FROM turns GROUP BY conversation_id, idx HAVING count(*) > 1"
    ).fetchall()


def test_a_file_is_recorded_once_per_profile_and_content():
    """The imports table's key (its columns are checked with the fact log's schema)."""
    db = Database(memory=True)
    migrate(db)
    assert ["profile_id", "sha256"] in [i.columns for i in db["imports"].indexes if i.unique]


# -- LoCoMo ----------------------------------------------------------------------------------


def test_locomo_imports_once_and_reimports_as_a_no_op(log, importer, tmp_path, locomo_file):
    report = importer.import_path(locomo_file)
    assert [f.status for f in report.files] == ["imported"]
    assert (report.conversations, report.turns_added) == (7, 78)
    assert count(log, "SELECT count(*) FROM conversations") == 7
    assert count(log, "SELECT count(*) FROM turns") == 78
    sources = log.db.execute("SELECT source_id FROM conversations ORDER BY id").fetchall()
    assert [s for (s,) in sources] == [
        *(f"fx-1/session_{n}" for n in range(1, 5)),
        *(f"fx-2/session_{n}" for n in range(1, 4)),
    ]
    assert no_duplicates(log)
    row = log.db.execute(
        "SELECT format, status, conversations, turns_added FROM imports"
    ).fetchall()
    assert row == [("locomo", "imported", 7, 78)]
    assert locomo_file.exists()  # a file outside the inbox is never moved

    again = importer.import_path(locomo_file)
    assert [f.status for f in again.files] == ["skipped"]
    assert again.turns_added == 0

    same_bytes = tmp_path / "other-name.json"
    shutil.copyfile(locomo_file, same_bytes)
    assert [f.status for f in importer.import_path(same_bytes).files] == ["skipped"]

    # same conversations, different bytes (so a different hash): idempotent by conversation id
    reformatted = tmp_path / "locomo-reformatted.json"
    reformatted.write_text(json.dumps(json.loads(locomo_file.read_text()), indent=2))
    assert file_sha256(reformatted) != file_sha256(locomo_file)
    report = importer.import_path(reformatted)
    assert [f.status for f in report.files] == ["imported"]
    assert (report.conversations, report.turns_added) == (7, 0)
    assert count(log, "SELECT count(*) FROM turns") == 78
    assert count(log, "SELECT count(*) FROM imports") == 2


def test_locomo_import_throughput(log, importer, locomo_file):
    report = importer.import_path(locomo_file)
    assert report.turns_added == 78 and report.seconds > 0 and report.turns_per_s > 0
    print(
        f"\nLoCoMo import: {report.turns_added} turns, {report.conversations} conversations in "
        f"{report.seconds:.3f} s = {report.turns_per_s:,.0f} turns/s (parse + SQLite, no encoding)"
    )


# -- folders, bad files, the inbox -----------------------------------------------------------


def make_batch(folder: Path) -> dict[str, Path]:
    """Good and bad files, in this mtime order."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "notes.txt": "Just some thoughts about the weekend.\nNothing like a chat here.\n",
        "a.jsonl": jsonl(chat("a", 4)),
        "broken.json": '[{"mapping": {"n1": {"message": null, "parent": null, "children": []}}, ',
        "familia.txt": whatsapp([("Ana", "Bom dia"), ("Rui", "Olá!")]),
        "photo.bin": bytes(range(256)) * 8,
        "empty.jsonl": "",
        "bad-line.jsonl": jsonl(chat("bad", 2)) + "{not json\n",
        "transcript.md": (FIXTURES / "markdown" / "transcript.md").read_text(),
        "conversations.json": (FIXTURES / "chatgpt" / "conversations.json").read_text(),
        ".hidden.jsonl": jsonl(chat("hidden", 2)),
        "download.jsonl.part": jsonl(chat("partial", 2)),
    }
    paths = {}
    for n, (name, content) in enumerate(files.items()):
        path = folder / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        os.utime(path, ns=(1_700_000_000_000_000_000 + n * 10**9,) * 2)
        paths[name] = path
    return paths


BAD = {"notes.txt", "broken.json", "photo.bin", "empty.jsonl", "bad-line.jsonl"}
GOOD = ["a.jsonl", "familia.txt", "transcript.md", "conversations.json"]


def test_folder_in_the_inbox_files_good_and_bad_away(log, importer, tmp_path):
    inbox = tmp_path / "inbox"
    make_batch(inbox)
    events: list[ProgressEvent] = []
    report = importer.import_path(inbox, on_progress=events.append)

    # every candidate seen once, in mtime order; dotfiles and partial downloads left alone
    names = [f.path.name for f in report.files]
    assert names == [
        "notes.txt",
        "a.jsonl",
        "broken.json",
        "familia.txt",
        "photo.bin",
        "empty.jsonl",
        "bad-line.jsonl",
        "transcript.md",
        "conversations.json",
    ]
    assert {f.path.name for f in report.quarantined} == BAD
    assert [f.path.name for f in report.imported] == GOOD  # the batch went on after bad files
    assert sorted(p.name for p in (inbox / "imported").iterdir()) == sorted(GOOD)
    quarantine = inbox / "quarantine"
    assert sorted(p.name for p in quarantine.iterdir()) == sorted(
        [*BAD, *(n + REASON_SUFFIX for n in BAD)]
    )
    assert sorted(p.name for p in inbox.iterdir()) == [
        ".hidden.jsonl",
        "download.jsonl.part",
        "imported",
        "quarantine",
    ]
    reasons = {f.path.name: f.reason for f in report.quarantined}
    assert "not a supported chat export" in reasons["notes.txt"]
    assert "malformed" in reasons["broken.json"] and "truncated" in reasons["broken.json"]
    assert "empty" in reasons["empty.jsonl"]
    assert "line 3" in reasons["bad-line.jsonl"]
    for name in BAD:
        text = (quarantine / (name + REASON_SUFFIX)).read_text()
        assert reasons[name] in text and name in text

    # bad-line.jsonl is one conversation: nothing of it is stored
    rows = log.db.execute("SELECT path, status, reason FROM imports ORDER BY id").fetchall()
    assert [Path(p).name for p, _, _ in rows] == names
    assert {Path(p).name for p, s, _ in rows if s == "quarantined"} == BAD
    assert all(r for _, s, r in rows if s == "quarantined")
    assert report.turns_added == count(log, "SELECT count(*) FROM turns") > 0

    # progress: a start and a done per file, counting up; turns so far never decrease
    starts = [(e.file_index, e.file_count) for e in events if e.kind == "start"]
    assert starts == [(i, 9) for i in range(1, 10)]
    assert [e.result.status for e in events if e.kind == "done"] == [f.status for f in report.files]
    totals = [e.total_turns for e in events]
    assert totals == sorted(totals) and totals[-1] == report.turns_added

    # dropping the same files again: imported ones are skipped, names don't clash
    make_batch(inbox)
    report = importer.import_path(inbox)
    assert {f.path.name for f in report.skipped} == set(GOOD)
    assert report.turns_added == 0
    assert (inbox / "imported" / "a (2).jsonl").exists()
    assert (inbox / "quarantine" / f"notes (2).txt{REASON_SUFFIX}").exists()


def test_files_outside_the_inbox_are_only_reported(importer, tmp_path):
    folder = tmp_path / "downloads"
    paths = make_batch(folder)
    report = importer.import_path(folder)
    assert {f.path.name for f in report.quarantined} == BAD
    assert all(f.moved_to is None for f in report.files)
    assert all(p.exists() for p in paths.values())
    assert not (tmp_path / "inbox").exists()
    # an explicit path is imported whatever its name; a missing one is reported
    report = importer.import_path(paths["download.jsonl.part"])
    assert [f.status for f in report.files] == ["imported"]
    report = importer.import_path(folder / "nope.json")
    assert [f.status for f in report.files] == ["quarantined"]
    assert "No such file" in report.files[0].reason


def test_a_file_changed_during_its_import_stays_in_the_inbox(importer, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    path = inbox / "grouped.jsonl"
    path.write_text(
        jsonl(chat("x", 2), conversation_id="1") + jsonl(chat("y", 2), conversation_id="2")
    )

    def grow(event: ProgressEvent) -> None:
        if event.kind == "conversation" and event.conversations == 1:
            with path.open("a") as f:
                f.write(jsonl([("user", "late")], conversation_id="1"))

    report = importer.import_path(path, on_progress=grow)
    assert report.files[0].moved_to is None and path.exists()
    report = importer.import_path(path)  # the next look imports what was added
    assert report.turns_added == 1 and report.files[0].moved_to == inbox / "imported" / path.name


# -- grown and copied files ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "whatsapp", "markdown", "jsonl-grouped"])
def test_a_grown_file_adds_only_its_new_turns(log, importer, tmp_path, fmt):
    def render(n: int) -> str:
        lines = chat("grow", n)
        if fmt == "whatsapp":
            return whatsapp([("Ana" if w == "user" else "Rui", t) for w, t in lines])
        if fmt == "markdown":
            return "".join(f"{w.title()}: {t}\n\n" for w, t in lines)
        if fmt == "jsonl-grouped":
            return jsonl(lines, conversation_id="main")
        return jsonl(lines)

    path = tmp_path / (
        "chat.txt" if fmt == "whatsapp" else "chat.md" if fmt == "markdown" else "chat.jsonl"
    )
    path.write_text(render(10))
    assert importer.import_path(path).turns_added == 10
    path.write_text(render(13))  # the export grew by 3 turns: new hash, same path
    report = importer.import_path(path)
    assert [f.status for f in report.files] == ["imported"]
    assert report.turns_added == 3
    renamed = tmp_path / ("renamed" + path.suffix)  # a renamed copy, grown again
    renamed.write_text(render(15))
    assert importer.import_path(renamed).turns_added == 2
    assert count(log, "SELECT count(*) FROM conversations") == 1
    assert count(log, "SELECT count(*) FROM turns") == 15
    assert no_duplicates(log)


def test_different_chats_with_the_same_id_or_first_turn_stay_apart(log, importer, tmp_path):
    first = [("Ana", "Olá"), ("Rui", "Tudo bem?")]
    (tmp_path / "a.txt").write_text(whatsapp([*first, ("Ana", "Sim")]))
    (tmp_path / "b.txt").write_text(whatsapp([*first, ("Ana", "Não"), ("Rui", "Porquê?")]))
    (tmp_path / "c.jsonl").write_text(jsonl(chat("c", 3), conversation_id="1"))
    (tmp_path / "d.jsonl").write_text(jsonl(chat("d", 3), conversation_id="1"))
    report = importer.import_path(tmp_path)
    assert report.turns_added == 3 + 4 + 3 + 3
    ids = {r[0] for r in log.db.execute("SELECT source_id FROM conversations").fetchall()}
    assert "1" in ids and "1~2" in ids
    assert sum(i.startswith("auto:") and i.endswith("~2") for i in ids) == 1
    # importing them again (other bytes, same content) maps each to its own conversation
    for name in ("a.txt", "b.txt", "c.jsonl", "d.jsonl"):
        path = tmp_path / name
        path.write_text(path.read_text() + "\n")
    assert importer.import_path(tmp_path).turns_added == 0
    assert count(log, "SELECT count(*) FROM conversations") == 4


# -- crash safety ----------------------------------------------------------------------------

N_GROUPS, PER_GROUP = 100, 100  # 10,000 turns; group 99 has no conversation_id

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from inferscale_core.factlog import FactLog
    from inferscale_core.importers.pipeline import Importer

    log = FactLog.open(sys.argv[1])
    profile = log.profile()
    # slow each turn insert a little (inside the transaction) so the kill lands mid-import
    log.db.conn.set_trace_callback(
        lambda sql: time.sleep(0.0002) if sql.startswith("INSERT INTO turns") else None
    )
    print("started", flush=True)
    Importer(log, profile, Path(sys.argv[3])).import_path(Path(sys.argv[2]))
    print("finished", flush=True)
    """
)


def crash_export(path: Path) -> set[tuple[str, int, str]]:
    """Write the 10,000-turn JSONL file; return its (group, index in group, text) triples."""
    expected = set()
    with path.open("w") as f:
        for i in range(N_GROUPS * PER_GROUP):
            group, idx = i % N_GROUPS, i // N_GROUPS
            text = f"turn {idx} of group {group}"
            record = {"role": "user", "content": text}
            if group != N_GROUPS - 1:
                record["conversation_id"] = f"g{group}"
            f.write(json.dumps(record) + "\n")
            expected.add((f"g{group}" if group != N_GROUPS - 1 else "anonymous", idx, text))
    return expected


def test_sigkill_during_import_loses_and_duplicates_nothing(tmp_path):
    db_path, export, inbox = tmp_path / "memory.db", tmp_path / "big.jsonl", tmp_path / "inbox"
    expected = crash_export(export)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db_path), str(export), str(inbox)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "started", child.stderr.read()
        reader = sqlite3.connect(db_path, timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.poll() is None:
            if reader.execute("SELECT count(*) FROM turns").fetchone()[0] >= 2000:
                break
            time.sleep(0.005)
        reader.close()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL, "the child finished before it was killed"

    with FactLog.open(db_path) as log:
        assert log.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = count(log, "SELECT count(*) FROM turns")
        assert 0 < stored < N_GROUPS * PER_GROUP
        per_conversation = log.db.execute(
            "SELECT count(*) FROM turns GROUP BY conversation_id"
        ).fetchall()
        assert {n for (n,) in per_conversation} == {PER_GROUP}  # whole conversations or none
        assert count(log, "SELECT count(*) FROM imports") == 0  # the file is not done

        report = Importer(log, log.profile(), inbox).import_path(export)  # run it again
        assert report.turns_added == N_GROUPS * PER_GROUP - stored
        assert count(log, "SELECT count(*) FROM turns") == N_GROUPS * PER_GROUP
        assert count(log, "SELECT count(*) FROM conversations") == N_GROUPS
        assert no_duplicates(log)
        rows = log.db.execute(
            "SELECT c.source_id, t.idx, t.text FROM turns t"
            " JOIN conversations c ON c.id = t.conversation_id"
        ).fetchall()
        got = {(s if not s.startswith("auto:") else "anonymous", i, t) for s, i, t in rows}
        assert got == expected  # nothing lost, nothing extra
        assert Importer(log, log.profile(), inbox).import_path(export).files[0].status == "skipped"


def test_imports_are_recorded_through_the_fact_log(log, importer, tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    good, bad = folder / "good.jsonl", folder / "bad.txt"
    good.write_text(jsonl(chat("g", 3)))
    bad.write_text("no chat here\n")
    importer.import_path(folder)
    assert log.is_imported(importer.profile_id, file_sha256(good))
    assert not log.is_imported(importer.profile_id, file_sha256(bad))  # quarantined: retried
    assert not log.is_imported(log.profile("other"), file_sha256(good))
    again = {f.path.name: f.status for f in importer.import_path(folder).files}
    assert again == {"good.jsonl": "skipped", "bad.txt": "quarantined"}


def test_the_pipeline_leaves_all_sql_to_the_fact_log():
    source = (REPO / "inferscale_core" / "importers" / "pipeline.py").read_text()
    assert ".db" not in source and "execute(" not in source
    assert not re.search(r"\b(SELECT|INSERT|UPDATE|DELETE|BEGIN|COMMIT)\b", source)


def test_list_files_orders_by_mtime_then_name(tmp_path):
    for name, t in [("b", 5), ("a", 5), ("c", 1), (".d", 0), ("e.crdownload", 0), ("f.tmp", 0)]:
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (t, t))
    (tmp_path / "sub").mkdir()
    assert [p.name for p in list_files(tmp_path)] == ["c", "a", "b"]


# -- the CLI functions -----------------------------------------------------------------------


def test_run_import_shows_a_table_and_exits_1_when_files_were_quarantined(tmp_path):
    folder = tmp_path / "exports"
    make_batch(folder)
    out = io.StringIO()
    code, added = run_import(folder, Console(file=out, width=200))
    assert code == 1 and added > 0
    text = out.getvalue()
    assert "quarantined" in text and "not a supported chat export" in text
    assert "9 files: 4 imported, 0 skipped, 5 quarantined" in text
    out = io.StringIO()
    assert run_import(folder / "a.jsonl", Console(file=out, width=200)) == (0, 0)
    assert "skipped" in out.getvalue()
    assert memory_db().exists()


def test_import_says_when_its_memories_come_if_no_assistant_runs(tmp_path):
    # With no app or daemon running and no --encode, nothing extracts the new turns yet: the
    # command says so, once, instead of leaving `memory list` empty without a word.
    env = dict(os.environ, INFERSCALE_HOME=str(tmp_path / "home"))

    def run() -> str:
        done = run_python(["-m", "app", "import", str(FIXTURES / "whatsapp")], 120, env)
        assert done.returncode == 0, done.stderr[-2000:]
        return " ".join((done.stdout + done.stderr).split())

    first = run()
    assert "turns added" in first
    assert "extracted and encoded when the assistant next runs" in first
    assert "import --encode" in first
    again = run()  # the same export: skipped, nothing new to tell
    assert "0 imported" in again and "0 turns added" in again
    assert "next runs" not in again
