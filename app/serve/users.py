"""Who may use the server: its users, their API tokens (stored hashed) and salt secrets.

``users.db`` (SQLite, mode 0600) sits beside the server's fact log. A token is shown once, when
it is made (``inferscale-assistant users add NAME``); the file keeps its SHA-256 only (a token
is 256 random bits, so a plain hash is as strong as a slow one). Each user also has a random
``secret`` that never leaves the server: it scopes the user's prefix-cache blocks in vLLM
(the cache salt) so that no block is ever shared between two users.

A user is an id, not a name: ``add`` gives each user a random ``id``, and their memory is the
fact-log profile ``user:<id>``. Removing a user archives their memory (it stays in the fact
log under that id, which no token reaches); a new user of the same name gets a new id and
starts empty. Users made before ids existed keep ``id = name`` (their profile ``user:<name>``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlite_utils import Database

from inferscale_core.files import create_private

TOKEN_PREFIX = "isk-"
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


class UserError(ValueError):
    """A user name that is invalid, taken or unknown; the message says which."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    secret: str  # in this user's cache salts (never sent anywhere)
    id: str  # who the user is: random, never reused (a name is, after `users remove`)

    @property
    def profile(self) -> str:
        """The user's profile in the server's fact log."""
        return profile_of(self.id)


def profile_of(user_id: str) -> str:
    return f"user:{user_id}"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Users:
    """The users of one server (``users.db``)."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        create_private(path)  # never a second descriptor on a live database (files.py)
        os.chmod(path, 0o600)
        self.path = path
        # Made on the main thread, used on the server's event loop (one thread at a time).
        self.db = Database(sqlite3.connect(path, check_same_thread=False))
        with self.db.conn:
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, token_sha256 TEXT"
                " NOT NULL UNIQUE, secret TEXT NOT NULL, created_at TEXT NOT NULL, id TEXT)"
            )
            if "id" not in self.db["users"].columns_dict:  # a users.db from before ids
                with contextlib.suppress(sqlite3.OperationalError):  # another process did it
                    self.db.execute("ALTER TABLE users ADD COLUMN id TEXT")
            self.db.execute("UPDATE users SET id = name WHERE id IS NULL")  # kept their memory
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS users_id ON users (id)")

    def close(self) -> None:
        self.db.close()

    def add(self, name: str) -> str:
        """Create ``name`` and return its token (shown once; only its hash is kept)."""
        if not NAME.fullmatch(name):
            raise UserError(
                f"invalid user name {name!r}: 1-64 of a-z, 0-9, '_', '.', '-', starting with a"
                " letter or digit"
            )
        if self._row(name) is not None:
            raise UserError(f"user {name!r} exists (`users token {name}` makes a new token)")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.db.conn:
            self.db.execute(
                "INSERT INTO users (name, token_sha256, secret, created_at, id)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    name,
                    _digest(token),
                    secrets.token_hex(16),
                    datetime.now(UTC).isoformat(),
                    secrets.token_hex(16),
                ),
            )
        return token

    def new_token(self, name: str) -> str:
        """Replace ``name``'s token (the old one stops working at once)."""
        if self._row(name) is None:
            raise UserError(f"no user {name!r}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.db.conn:
            self.db.execute(
                "UPDATE users SET token_sha256 = ? WHERE name = ?", (_digest(token), name)
            )
        return token

    def remove(self, name: str) -> str:
        """Revoke ``name``'s access; return the fact-log profile their memory is archived
        under (``user:<id>``: kept, reached by no token, never given to a new user)."""
        row = self.db.execute("SELECT id FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UserError(f"no user {name!r}")
        with self.db.conn:
            self.db.execute("DELETE FROM users WHERE name = ?", (name,))
        return profile_of(row[0])

    def names(self) -> list[tuple[str, str]]:
        """``(name, created_at)`` of every user, by name."""
        rows = self.db.execute("SELECT name, created_at FROM users ORDER BY name").fetchall()
        return [(str(n), str(c)) for n, c in rows]

    def authenticate(self, token: str) -> User | None:
        """The user whose token this is, or None."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = _digest(token)
        row = self.db.execute(
            "SELECT name, token_sha256, secret, id FROM users WHERE token_sha256 = ?", (digest,)
        ).fetchone()
        if row is None or not hmac.compare_digest(row[1], digest):
            return None
        return User(row[0], row[2], row[3])

    def _row(self, name: str) -> tuple[str, ...] | None:
        return self.db.execute("SELECT name FROM users WHERE name = ?", (name,)).fetchone()
