"""What each assistant turn used: the ``reply_details`` and ``reply_memories`` tables.

The session saves a reply's details (mode, k, the engine's figures, its notes, and the memories
in prompt order with the text that went into the prompt) in the transaction that appends the
assistant turn, so a reopened conversation's memory panel shows them as it did live. They go
with their turn (ON DELETE CASCADE). A forgotten fact's text does not survive here: forgetting
blanks it in every stored reply in the forget's transaction (:meth:`ReplyDetailsMixin.
_forget_in_replies`), and saving blanks the memories whose fact is already forgotten; the id
stays, marked ``forgotten``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from itertools import islice

from inferscale_core.factlog._base import FactLogBase
from inferscale_core.types import ReplyDetails, ReplyMemory

BATCH = 500  # turn ids per query, well under SQLite's limit on bound parameters

_DETAIL_COLUMNS = (
    "turn_id, mode, k, ttft_s, prompt_tokens, injected_tokens, computed_tokens,"
    " prefix_cached_tokens, refused, notes"
)
_MEMORY_COLUMNS = "turn_id, fact_id, text, refers_to, score, how, tier, forgotten"


def _batches(ids: Iterable[int]) -> Iterator[list[int]]:
    it = iter(sorted({int(i) for i in ids}))
    while batch := list(islice(it, BATCH)):
        yield batch


class ReplyDetailsMixin(FactLogBase):
    def save_reply_details(self, turn_id: int, details: ReplyDetails) -> None:
        """Store what the assistant turn ``turn_id`` used, replacing what was stored for it.

        A memory whose fact is forgotten by now is stored without its text. Raises ``KeyError``
        if the turn does not exist, and ``sqlite3.IntegrityError`` if a memory names a fact
        that does not exist or belongs to another profile.
        """
        with self.transaction():
            profile_id = self._one("SELECT profile_id FROM turns WHERE id = ?", (turn_id,))
            if profile_id is None:
                raise KeyError(f"no turn {turn_id}")
            self.db.execute("DELETE FROM reply_details WHERE turn_id = ?", (turn_id,))
            self.db.execute(
                f"INSERT INTO reply_details ({_DETAIL_COLUMNS}, profile_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    turn_id,
                    details.mode,
                    details.k,
                    details.ttft_s,
                    details.prompt_tokens,
                    details.injected_tokens,
                    details.computed_tokens,
                    details.prefix_cached_tokens,
                    details.refused,
                    json.dumps(list(details.notes)),
                    profile_id,
                ),
            )
            gone = self._forgotten({m.fact_id for m in details.memories})
            self.db.conn.executemany(
                "INSERT INTO reply_memories (turn_id, pos, profile_id, fact_id, text, refers_to,"
                " score, how, tier, forgotten) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        turn_id,
                        pos,
                        profile_id,
                        m.fact_id,
                        "" if m.fact_id in gone or m.forgotten else m.text,
                        m.refers_to,
                        m.score,
                        m.how,
                        m.tier,
                        int(m.fact_id in gone or m.forgotten),
                    )
                    for pos, m in enumerate(details.memories)
                ],
            )

    def reply_details(self, turn_ids: Iterable[int]) -> dict[int, ReplyDetails]:
        """The stored details of those of ``turn_ids`` that have them, by turn id."""
        found: dict[int, ReplyDetails] = {}
        for batch in _batches(turn_ids):
            marks = ",".join("?" * len(batch))
            memories: dict[int, list[ReplyMemory]] = {}
            for tid, fid, text, refers_to, score, how, tier, forgotten in self.db.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM reply_memories WHERE turn_id IN ({marks})"
                " ORDER BY turn_id, pos",
                batch,
            ):
                memory = ReplyMemory(fid, text, refers_to, score, how, tier, bool(forgotten))
                memories.setdefault(tid, []).append(memory)
            for row in self.db.execute(
                f"SELECT {_DETAIL_COLUMNS} FROM reply_details WHERE turn_id IN ({marks})", batch
            ):
                tid, mode, k, ttft_s, prompt, injected, computed, prefix, refused, notes = row
                found[tid] = ReplyDetails(
                    mode,
                    k,
                    tuple(memories.get(tid, ())),
                    tuple(json.loads(notes)),
                    ttft_s,
                    prompt,
                    injected,
                    computed,
                    prefix,
                    refused,
                )
        return found

    def _forgotten(self, fact_ids: set[int]) -> set[int]:
        """Which of ``fact_ids`` are forgotten facts."""
        if not fact_ids:
            return set()
        ids = sorted(fact_ids)
        rows = self.db.execute(
            f"SELECT id FROM facts WHERE status = 'forgotten'"
            f" AND id IN ({','.join('?' * len(ids))})",
            ids,
        )
        return {r[0] for r in rows}

    def _forget_in_replies(self, fact_id: int) -> None:
        """Blank a forgotten fact's text in every stored reply (call inside the forget's
        transaction)."""
        self.db.execute(
            "UPDATE reply_memories SET text = '', forgotten = 1"
            " WHERE fact_id = ? AND (text <> '' OR forgotten = 0)",
            (fact_id,),
        )
