"""Which turns a fact is encoded after: its context window.

A fact's K/V are computed after the system prefix and some of the conversation turns before
the turn it comes from (``w`` of them, as plain lines), so that they carry what the turn was
about. Two ways to choose those turns:

* ``sliding`` — exactly the ``w`` turns before. Every fact gets its own context, so encoding
  a conversation prefills each turn about ``w`` times over (LoCoMo at w=20: 1.31M tokens
  for 2,541 facts).
* ``anchored`` — every turn since an anchor, the anchors ``w`` turns apart and the context
  always at least ``w`` turns long (``w`` to ``2w - 1``; fewer only at the start of a
  conversation). Consecutive facts then share their context up to the newest turn, so the
  engine's prefix cache computes each turn about twice (LoCoMo at w=20: ~5x fewer tokens),
  and a new fact of the newest turn costs its own tokens and its turn's.

With ``w = 0`` both are the system prefix alone, the same encoding. The two are different
encodings of a fact: the fact log records which one an entry is (:func:`encoding_version`),
so switching re-encodes in the background like a change of ``w``.
"""

from __future__ import annotations

SLIDING = "sliding"
ANCHORED = "anchored"
WINDOWS = (ANCHORED, SLIDING)


def check_window(window: str) -> str:
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}; got {window!r}")
    return window


def first_context_turn(idx: int, w: int, window: str) -> int:
    """Index of the first context turn of the turn at ``idx`` in its conversation; the context
    is the turns from there up to ``idx`` (excluded)."""
    check_window(window)
    if w < 0 or idx < 0:
        raise ValueError(f"w and idx must be >= 0, got w={w}, idx={idx}")
    if w == 0:
        return idx
    if window == SLIDING:
        return max(0, idx - w)
    return max(0, (idx // w - 1) * w)


def encoding_version(encoder_version: str, w: int, window: str) -> str:
    """What the fact log records as a fact's encoding, beside the model and ``w``."""
    check_window(window)
    if window == SLIDING or w == 0:
        return encoder_version
    return f"{encoder_version}+{window}"
