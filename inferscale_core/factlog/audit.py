"""The history of every fact change: the ``audit`` table.

:mod:`inferscale_core.factlog.facts` writes one row per add, update, delete or forget, in the
same transaction as the change, with the text before and after. The rows are never changed or
deleted, so a forgotten fact's text survives here (see the package docstring).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inferscale_core.factlog._base import FactLogBase
from inferscale_core.types import AuditEntry


class AuditMixin(FactLogBase):
    def audit(self, profile_id: int, fact_id: int | None = None) -> list[AuditEntry]:
        """The profile's audit trail (optionally of one fact), oldest first."""
        sql = (
            "SELECT id, profile_id, fact_id, action, cause, old_text, new_text, at FROM audit"
            " WHERE profile_id = ?"
        )
        params: list[Any] = [profile_id]
        if fact_id is not None:
            sql += " AND fact_id = ?"
            params.append(fact_id)
        rows = self.db.execute(sql + " ORDER BY id", params).fetchall()
        return [
            AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], datetime.fromisoformat(r[7]))
            for r in rows
        ]

    def _audit(
        self,
        profile_id: int,
        fact_id: int,
        action: str,
        cause: str,
        old_text: str | None,
        new_text: str | None,
        at: str,
    ) -> None:
        """Write one audit row (call inside the transaction of the change it records)."""
        self.db.execute(
            "INSERT INTO audit (profile_id, fact_id, action, cause, old_text, new_text, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (profile_id, fact_id, action, cause, old_text, new_text, at),
        )
