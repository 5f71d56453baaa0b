"""The API's memory ids (app/serve/ids.py): a keyed permutation per user, reversible, that
hides the fact log's one sequence (whose gaps showed a user the others' activity)."""

from __future__ import annotations

from app.serve.ids import BITS, FactIds


def test_ids_map_back_and_never_collide():
    ids = FactIds("a" * 32)
    public = [ids.public(n) for n in range(1, 5001)]
    assert len(set(public)) == 5000 and all(0 <= p < 1 << BITS for p in public)
    assert [ids.private(p) for p in public] == list(range(1, 5001))
    assert ids.public((1 << BITS) - 1) < 1 << BITS


def test_ids_hide_the_sequence_and_differ_per_user():
    ana, bo = FactIds("a" * 32), FactIds("b" * 32)
    steps = [ana.public(n + 1) - ana.public(n) for n in range(1, 200)]
    assert len(set(steps)) == len(steps)  # no constant stride to count others' facts by
    assert all(abs(step) > 1000 for step in steps)
    assert sum(ana.public(n) == bo.public(n) for n in range(1, 2000)) == 0
    assert FactIds("a" * 32).public(7) == ana.public(7)  # the same after a restart


def test_numbers_no_id_maps_to_are_none():
    ids = FactIds("c" * 32)
    assert ids.private(-1) is None and ids.private(1 << BITS) is None
    assert ids.private(1 << 70) is None
