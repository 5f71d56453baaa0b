"""How far fact extraction has read each profile's turns: the ``extraction_cursor`` table.

The extractor asks :meth:`~inferscale_core.factlog.FactLog.turns` for the turns after the
cursor and moves it after adding their facts. A crash in between re-extracts those turns, and
the facts' dedup by normalized text makes the redo a no-op.
"""

from __future__ import annotations

from inferscale_core.factlog._base import FactLogBase


class ExtractionCursorMixin(FactLogBase):
    def extraction_cursor(self, profile_id: int) -> int:
        """The last turn id whose facts were extracted (0: none yet)."""
        value = self._one(
            "SELECT last_turn_id FROM extraction_cursor WHERE profile_id = ?", (profile_id,)
        )
        return int(value or 0)

    def set_extraction_cursor(self, profile_id: int, turn_id: int) -> None:
        """Set the profile's cursor to ``turn_id``, the last turn whose facts were extracted."""
        with self.transaction():
            self.db.execute(
                "INSERT INTO extraction_cursor (profile_id, last_turn_id) VALUES (?, ?)"
                " ON CONFLICT (profile_id) DO UPDATE SET last_turn_id = excluded.last_turn_id",
                (profile_id, turn_id),
            )
