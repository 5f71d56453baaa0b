"""The scheduler's decision (what to load, or why not) without vLLM."""

import pytest

from inferscale_core.composer import ComposedPrompt, PlacedEntry
from inferscale_core.kvstore import EntryHeader, EntryMissingError
from inferscale_core.load_plan import Piece, Refused, plan_load, slot_mapping

FP = "fp-model"
# Where each entry's keys were computed: "a" right after the prefix (where it is placed below,
# shift 0), "b" after a longer context (placed earlier: a negative shift).
ORIGINS = {"p": 0, "a": 4, "b": 30}
SHIFTS = {"p": 0, "a": 0, "b": 7 - 30}


def _header_lookup(entries: dict[str, tuple[int, ...]], fingerprint: str = FP):
    def headers(keys: list[str]) -> list[EntryHeader]:
        for key in keys:
            if key not in entries:
                raise EntryMissingError(key)
        return [
            EntryHeader(k, entries[k], fingerprint, (2, len(entries[k]), 1, 4), 0, ORIGINS[k])
            for k in keys
        ]

    return headers


def _composed():
    # prefix [0, 4), fact a [4, 7), fact b [7, 9), suffix [9, 12)
    prompt = [1, 2, 3, 4, 10, 11, 12, 20, 21, 90, 91, 92]
    entries = [PlacedEntry("p", 0, 4), PlacedEntry("a", 4, 7), PlacedEntry("b", 7, 9)]
    stored = {"p": (1, 2, 3, 4), "a": (10, 11, 12), "b": (20, 21)}
    return ComposedPrompt(prompt, entries, ["a", "b"]), stored


def test_no_params_means_no_load():
    assert plan_load(None, [1, 2], 2, 0, _header_lookup({}), FP) is None
    assert plan_load({"other": 1}, [1, 2], 2, 0, _header_lookup({}), FP) is None


def test_full_load_from_zero():
    composed, stored = _composed()
    plan = plan_load(
        composed.kv_transfer_params(FP), composed.prompt_ids, 12, 0, _header_lookup(stored), FP
    )
    assert (plan.start, plan.end) == (0, 9) == (0, composed.span_end)
    assert plan.pieces == [Piece("p", 0, 4, 0, 0), Piece("a", 0, 3, 4, 0), Piece("b", 0, 2, 7, -23)]
    assert plan.entry_keys == ["p", "a", "b"]


def test_load_starts_after_prefix_cache_hit():
    composed, stored = _composed()
    plan = plan_load(
        composed.kv_transfer_params(FP), composed.prompt_ids, 12, 5, _header_lookup(stored), FP
    )
    assert (plan.start, plan.end, plan.num_tokens) == (5, 9, 4)
    assert plan.pieces == [Piece("a", 1, 3, 5, 0), Piece("b", 0, 2, 7, -23)]


def test_fully_cached_span_loads_nothing():
    composed, stored = _composed()
    plan = plan_load(
        composed.kv_transfer_params(FP), composed.prompt_ids, 12, 9, _header_lookup(stored), FP
    )
    assert plan.num_tokens == 0 and plan.pieces == []


def test_load_capped_at_num_tokens_minus_one():
    prompt = [1, 2, 3, 4]
    composed = ComposedPrompt(prompt, [PlacedEntry("p", 0, 4)], [])
    plan = plan_load(
        composed.kv_transfer_params(FP), prompt, 4, 0, _header_lookup({"p": (1, 2, 3, 4)}), FP
    )
    assert (plan.start, plan.end) == (0, 3)
    assert plan.pieces == [Piece("p", 0, 3, 0)]
    # one entry cut at both ends: the prefix cache holds position 0, the last is computed
    headers = _header_lookup({"p": (1, 2, 3, 4)})
    plan = plan_load(composed.kv_transfer_params(FP), prompt, 4, 1, headers, FP)
    assert (plan.start, plan.end, plan.pieces) == (1, 3, [Piece("p", 1, 3, 1)])
    plan = plan_load(composed.kv_transfer_params(FP), prompt, 4, 3, headers, FP)
    assert (plan.start, plan.end, plan.pieces) == (3, 3, [])  # nothing left to load


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda p, s, kw: s.pop("a"), "unknown entry a"),
        (lambda p, s, kw: s.__setitem__("a", (10, 11, 13)), "do not match entry a"),
        # the span's tokens all match, but a and b split them elsewhere than their places
        (lambda p, s, kw: s.update(a=(10, 11), b=(12, 20, 21)), "do not match entry a"),
        (lambda p, s, kw: s.__setitem__("b", (20, 22)), "do not match entry b"),
        (lambda p, s, kw: kw.__setitem__("fingerprint", "other"), "does not match the engine"),
        (lambda p, s, kw: kw.__setitem__("header_fp", "other"), "encoded by another model"),
        (lambda p, s, kw: kw.__setitem__("prompt_logprobs", True), "prompt logprobs"),
        (lambda p, s, kw: p["inferscale"]["entries"].pop(1), "does not continue"),
        (lambda p, s, kw: p["inferscale"].__setitem__("v", 99), "unsupported"),
        (lambda p, s, kw: p["inferscale"].__setitem__("entries", [["x"]]), "malformed"),
    ],
)
def test_refusals_say_why(mutate, reason):
    composed, stored = _composed()
    params = composed.kv_transfer_params(FP)
    kw = {"fingerprint": FP, "header_fp": FP, "prompt_logprobs": False}
    mutate(params, stored, kw)
    with pytest.raises(Refused, match=reason):
        plan_load(
            params,
            composed.prompt_ids,
            12,
            0,
            _header_lookup(stored, kw["header_fp"]),
            kw["fingerprint"],
            prompt_logprobs=kw["prompt_logprobs"],
        )


def test_truncated_plan_keeps_leading_positions():
    composed, stored = _composed()
    plan = plan_load(
        composed.kv_transfer_params(FP), composed.prompt_ids, 12, 2, _header_lookup(stored), FP
    )
    short = plan.truncated(3)  # positions [2, 5)
    assert (short.start, short.end) == (2, 5)
    assert short.pieces == [Piece("p", 2, 4, 2, 0), Piece("a", 0, 1, 4, 0)]


def test_slot_mapping_follows_block_table():
    # block size 4; the request's blocks are 7, 3, 9
    assert slot_mapping([7, 3, 9], 4, 2, 10).tolist() == [30, 31, 12, 13, 14, 15, 36, 37]


def test_pieces_match_the_per_entry_rule_for_every_cut():
    """Pieces come from column-wise bisects; they must equal the plain per-entry rule."""
    composed, stored = _composed()
    params, headers = composed.kv_transfer_params(FP), _header_lookup(stored)
    spans = [(e.key, e.start, e.end) for e in composed.entries]
    for num_tokens in range(2, 13):
        for computed in range(0, 12):
            plan = plan_load(params, composed.prompt_ids, num_tokens, computed, headers, FP)
            end = min(9, num_tokens - 1)
            expected = [
                Piece(key, max(computed, s) - s, min(end, e) - s, max(computed, s), SHIFTS[key])
                for key, s, e in spans
                if max(computed, s) < min(end, e)
            ]
            assert plan.pieces == expected, (num_tokens, computed)
            assert (plan.start, plan.end) == (computed, max(computed, end))
