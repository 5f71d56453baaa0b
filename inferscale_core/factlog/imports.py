"""Which export files were imported: the ``imports`` table.

One row per file content (sha256) per profile, written by the import pipeline after the file's
last conversation is stored, so a file cut short by a crash has no row and is parsed again. An
'imported' hash is skipped next time; a 'quarantined' one is tried again (the parser may have
learnt the format meanwhile). Recording a hash again replaces its row.
"""

from __future__ import annotations

from pathlib import Path

from inferscale_core.factlog._base import FactLogBase, utc_now

IMPORT_STATUSES = ("imported", "quarantined")


class ImportsMixin(FactLogBase):
    def is_imported(self, profile_id: int, sha256: str) -> bool:
        """Whether a file with this content was imported into the profile (not quarantined)."""
        return (
            self._one(
                "SELECT 1 FROM imports WHERE profile_id = ? AND sha256 = ? AND status = 'imported'",
                (profile_id, sha256),
            )
            is not None
        )

    def record_import(
        self,
        profile_id: int,
        path: Path | str,
        sha256: str,
        *,
        fmt: str | None,
        status: str,
        reason: str | None = None,
        conversations: int = 0,
        turns_added: int = 0,
    ) -> None:
        """Record the outcome of importing the file at ``path`` whose bytes hash to ``sha256``.

        ``status`` is "imported" or "quarantined" (then ``reason`` says why); ``fmt`` is the
        detected format (None if detection failed), ``conversations`` the number read from the
        file and ``turns_added`` the new turns stored. Replaces an earlier row of the same
        content, stamped with the time now.
        """
        if status not in IMPORT_STATUSES:
            raise ValueError(f"import status must be one of {IMPORT_STATUSES}, got {status!r}")
        with self.transaction():
            self.db.execute(
                "INSERT INTO imports (profile_id, path, sha256, format, status, reason,"
                " conversations, turns_added, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (profile_id, sha256) DO UPDATE SET path = excluded.path,"
                " format = excluded.format, status = excluded.status, reason = excluded.reason,"
                " conversations = excluded.conversations, turns_added = excluded.turns_added,"
                " at = excluded.at",
                (
                    profile_id,
                    str(path),
                    sha256,
                    fmt,
                    status,
                    reason,
                    conversations,
                    turns_added,
                    utc_now(),
                ),
            )

    def quarantined_imports(self, profile_id: int, limit: int = 100) -> list[tuple[Path, str]]:
        """``(path, reason)`` of the files that were quarantined and not imported since, the
        latest first (the inbox and the import screen record them alike)."""
        rows = self.db.execute(
            "SELECT path, reason FROM imports WHERE profile_id = ? AND status = 'quarantined'"
            " ORDER BY at DESC, id DESC LIMIT ?",
            (profile_id, limit),
        ).fetchall()
        return [(Path(path), reason or "") for path, reason in rows]
