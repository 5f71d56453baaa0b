"""What a backup holds: its members (what to copy from where) and its manifest (what was copied).

The manifest is the payload's last member, ``manifest.json``::

    {"format": 1, "created_at": "2026-03-01T10:00:00+00:00", "tool_version": "0.1.0",
     "with_kv": false, "about": {"models": ["llama3.2-1b"], ...},
     "members": [{"name": "data/memory.db", "kind": "factlog", "size": 1048576,
                  "sha256": "…", "rows": {"facts": 1000, "turns": 4000, …}}, …]}

A member's name is ``<root>/<path in it>``: ``data/`` is the data folder, ``config/`` the config
folder (``paths.data_dir()`` / ``paths.config_dir()`` where it is restored). Imports nothing
from the project.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_NAME = "manifest.json"
KINDS = ("factlog", "sqlite", "file", "kv")


@dataclass(frozen=True, slots=True)
class Member:
    """Something to back up: ``path`` on this machine, stored as ``name``.

    ``kind``: "factlog" (a fact log: copied live with SQLite's backup API; its ``kv_entries``
    rows kept only for entry files copied with it), "sqlite" (another live database, e.g.
    ``users.db``) or "file" (copied as is, e.g. ``config.toml``). ``kv_root`` and ``kv_name``:
    a fact log's KV store folder (``<fingerprint>/<key>.safetensors`` under it) and its name
    in the backup; its entries are copied with ``with_kv``. A missing path is left out.
    """

    name: str
    path: Path
    kind: str
    kv_root: Path | None = None
    kv_name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS[:3]:
            raise ValueError(f"member kind must be one of {KINDS[:3]}, got {self.kind!r}")
        check_name(self.name)
        if (self.kv_root is None) != (self.kv_name is None) or (
            self.kv_root is not None and self.kind != "factlog"
        ):
            raise ValueError(f"{self.name}: kv_root and kv_name go together, on a fact log")


@dataclass(slots=True)
class Stored:
    """One member as stored: its size and SHA-256, and row counts for a database."""

    name: str
    kind: str
    size: int  # bytes
    sha256: str
    rows: dict[str, int] | None = None  # {table: rows} of a "factlog" or "sqlite" member


@dataclass(slots=True)
class Manifest:
    format: int
    created_at: str  # ISO 8601, UTC
    tool_version: str
    with_kv: bool
    members: list[Stored] = field(default_factory=list)
    about: dict[str, Any] = field(default_factory=dict)  # the app's notes: model names, users

    def to_json(self) -> bytes:
        data = asdict(self)
        data["members"] = [{k: v for k, v in m.items() if v is not None} for m in data["members"]]
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Raises ``ValueError`` (or ``KeyError``/``TypeError``) when ``raw`` is not one."""
        data = json.loads(raw)
        members = [Stored(**m) for m in data.pop("members")]
        return cls(members=members, **data)

    def member(self, name: str) -> Stored | None:
        return next((m for m in self.members if m.name == name), None)

    def rows(self, table: str, kind: str = "factlog") -> int:
        """Rows of ``table`` over every member of ``kind``."""
        return sum((m.rows or {}).get(table, 0) for m in self.members if m.kind == kind)


def check_name(name: str) -> str:
    """``name`` if it is a safe relative member name (``root/…``, no ``..``), else ValueError."""
    parts = PurePosixPath(name).parts
    if (
        len(parts) < 2
        or name.startswith("/")
        or "\\" in name
        or any(p in ("", ".", "..") for p in parts)
        or str(PurePosixPath(*parts)) != name
    ):
        raise ValueError(f"bad member name {name!r}")
    return name
