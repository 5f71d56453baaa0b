"""A user's memory ids as the API shows them: a keyed permutation of the fact log's ids.

The fact log numbers every user's facts in one sequence, so its ids would show a user the
others' activity in the gaps between their own. The API shows each user their ids through a
pseudorandom permutation of ``[0, 2**52)`` (an 8-round Feistel network over two 26-bit halves,
the round function keyed BLAKE2b), keyed by a secret of that user that never leaves the
server: the ids look random, two users' ids cannot be compared, and nothing is stored (an id
maps back by running the rounds in reverse). 52 bits: a JSON number stays exact in every client
(JavaScript's integers end at 2**53).
"""

from __future__ import annotations

import hashlib

HALF_BITS = 26
BITS = 2 * HALF_BITS
MASK = (1 << HALF_BITS) - 1
ROUNDS = 8


class FactIds:
    """One user's mapping between the fact log's ids and the API's (``public`` / ``private``)."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.blake2b(secret.encode(), person=b"inferscale-ids").digest()

    def _round(self, i: int, half: int) -> int:
        data = bytes((i,)) + half.to_bytes(4, "big")
        return int.from_bytes(hashlib.blake2b(data, key=self._key, digest_size=4).digest()) & MASK

    def public(self, fact_id: int) -> int:
        """The API's id of the fact log's ``fact_id`` (0 < fact_id < 2**52)."""
        if not 0 <= fact_id < 1 << BITS:
            raise ValueError(f"fact id {fact_id} is out of the API's range")
        left, right = fact_id >> HALF_BITS, fact_id & MASK
        for i in range(ROUNDS):
            left, right = right, left ^ self._round(i, right)
        return left << HALF_BITS | right

    def private(self, public_id: int) -> int | None:
        """The fact log's id behind the API's ``public_id``; None for a number no id maps to
        (out of range: the caller's 404)."""
        if not 0 <= public_id < 1 << BITS:
            return None
        left, right = public_id >> HALF_BITS, public_id & MASK
        for i in reversed(range(ROUNDS)):
            left, right = right ^ self._round(i, left), left
        return left << HALF_BITS | right
