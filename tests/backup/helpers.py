"""What the backup tests share: a home with a real fact log, the CLI as a user runs it, and
table-by-table and byte-by-byte comparisons.

A home is an ``INFERSCALE_HOME``: ``data/`` (memory.db, kv/, serve/users.db) and ``config/``
(config.toml, models.json), the layout ``inferscale_core.paths`` gives the CLI.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support import REPO

FINGERPRINT = "feedc0ffee123456"  # the KV store folder the test entries live in
PASSPHRASE = "correct horse battery staple"


def cli(home: Path, *args: str, passphrase: str | None = None, timeout: int = 120):
    """``inferscale-assistant ARGS`` in a child process with ``INFERSCALE_HOME=home``."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=cli_env(home, passphrase),
        stdin=subprocess.DEVNULL,
    )


def cli_env(home: Path, passphrase: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "INFERSCALE_BACKUP_PASSPHRASE"}
    env["INFERSCALE_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if passphrase is not None:
        env["INFERSCALE_BACKUP_PASSPHRASE"] = passphrase
    return env


def build_home(home: Path, conversations: int = 50, facts: int = 1000) -> dict[str, int]:
    """A home whose fact log has ``facts`` facts in ``conversations`` conversations over two
    profiles ("default" and "work"), with edits, retirements, forgets and deferred facts, a
    settings file, a registered model and a server user. Returns what it made, by kind."""
    from app.serve.users import Users
    from inferscale_core.factlog import FactLog
    from inferscale_core.model_registry import RegisteredModel, register
    from inferscale_core.types import Conversation, Turn

    data, config = home / "data", home / "config"
    for folder in (home, data, config):
        folder.mkdir(mode=0o700, exist_ok=True)
    made = {"updated": 0, "forgotten": 0, "retired": 0, "deferred": 0}
    start = datetime(2024, 1, 1, tzinfo=UTC)
    with FactLog.open(data / "memory.db") as log:
        profiles = [log.profile("default"), log.profile("work")]
        per_conv = facts // conversations
        fact_ids: list[int] = []
        for c in range(conversations):
            pid = profiles[c % 2]
            turns = [
                Turn(
                    "user" if i % 2 == 0 else "assistant",
                    f"conversation {c} turn {i}: the weather in town {c * 31 + i}",
                    start + timedelta(hours=c * 24 + i),
                )
                for i in range(per_conv)
            ]
            conv_id, _ = log.add_conversation(pid, Conversation(f"chat {c}", turns))
            turn_ids = [t for t, _ in log.conversation_turns(conv_id)]
            for i, turn_id in enumerate(turn_ids):
                fid, created = log.add_fact(
                    pid, f"Fact {c}-{i}: town {c * 31 + i} has {i} parks", None, [turn_id]
                )
                assert created
                fact_ids.append(fid)
        for n, fid in enumerate(fact_ids[::10]):  # 100 facts touched, one way each
            if n % 4 == 0:
                log.update_fact(fid, f"Fact {fid} was corrected (edit {n})", "user edit")
                made["updated"] += 1
            elif n % 4 == 1:
                log.forget_fact(fid, "user asked to forget")
                made["forgotten"] += 1
            elif n % 4 == 2:
                log.delete_fact(fid, "no longer true")
                made["retired"] += 1
            else:
                made["deferred"] += log.defer_kv([fid], "import")
    (config / "config.toml").write_text('k = 12\nprofile = "default"\n', encoding="utf-8")
    register(
        RegisteredModel(
            "tiny-test",
            "/models/tiny.gguf",
            "/cache/tiny-1234",
            "tiny",
            "a test",
            "2026-01-01T00:00:00+00:00",
        ),
        config / "models.json",
    )
    users = Users(data / "serve" / "users.db")
    try:
        users.add("ana")
    finally:
        users.close()
    return made


def add_kv_entries(home: Path, count: int = 3) -> dict[str, bytes]:
    """``count`` real KV entry files (through the store's public API) recorded for the first
    active facts of the home's fact log; ``{file name: bytes}``."""
    import torch

    from inferscale_core.factlog import FactLog
    from inferscale_core.kvstore import KVStore
    from inferscale_core.types import FactKV

    store = KVStore(home / "data" / "kv" / FINGERPRINT, fingerprint=FINGERPRINT)
    written: dict[str, bytes] = {}
    with FactLog.open(home / "data" / "memory.db") as log:
        pid = log.profile("default")
        for i, fact in enumerate(log.active_facts(pid)[:count]):
            k = torch.arange(2 * 5 * 2 * 8, dtype=torch.float32).reshape(2, 5, 2, 8) + i
            entry = FactKV(f"entry-{fact.id}", list(range(10, 15)), k, -k, FINGERPRINT)
            path = store.put(entry)  # [layers=2, tokens=5, kv_heads=2, head_dim=8]
            log.record_kv(fact.id, FINGERPRINT, 20, "v1", entry.key, 5, path.stat().st_size)
            written[path.name] = path.read_bytes()
    return written


def tables(db: Path) -> dict[str, set[tuple]]:
    """Every row of every ordinary table of the database (FTS5's own tables left out: their
    segments are rewritten by merges, so they are compared through searches instead)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [
            r[0]
            for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " AND name NOT LIKE 'facts_fts_%'"
            )
        ]
        return {n: set(con.execute(f'SELECT * FROM "{n}"').fetchall()) for n in names}
    finally:
        con.close()


def tree(folder: Path) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def digest_tree(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` (folders as "dir")."""
    return {
        str(p.relative_to(folder)): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]
