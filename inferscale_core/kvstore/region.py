"""One entry as one byte region: K, then V, then a compressed entry's scales, each aligned.

The GPU pool keeps every entry so (:class:`~inferscale_core.kvstore.tiers.DeviceTier`), and the
load kernels read it in place by byte offsets. Host RAM keeps it the same way, in one (pinned,
on CUDA) buffer per entry, and files are read straight into such a buffer
(:func:`~inferscale_core.kvstore.entry_file.read_entry`): an entry then crosses from host RAM
to the pool, or back, as ONE copy of its region, whatever it is stored as (two tensors for the
model's dtype, four for fp8, six for int4).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from inferscale_core.kvstore.quant import entry_tensors, with_tensors
from inferscale_core.types import FactKV

ALIGN = 256
"""Where each tensor of a region starts (bytes, from the region's start): the pool's too."""

ORDER = ("k", "v", "k_scale", "v_scale", "k_zero", "v_zero", "k_fine", "k_slot")
"""The tensors' order in a region (:func:`~inferscale_core.kvstore.quant.entry_tensors`')."""


def rounded(nbytes: int, align: int = ALIGN) -> int:
    """``nbytes`` rounded up to ``align`` (at least one ``align``: an empty tensor too)."""
    return max(align, -(-nbytes // align) * align)


def layout(sizes: Iterable[tuple[str, int]], align: int = ALIGN) -> tuple[dict[str, int], int]:
    """Byte offsets of the named tensors (``(name, nbytes)`` pairs) in a region, in
    :data:`ORDER`, and the region's size."""
    by_name = dict(sizes)
    offsets: dict[str, int] = {}
    at = 0
    for name in ORDER:
        if name in by_name:
            offsets[name] = at
            at += rounded(by_name[name], align)
    if len(offsets) != len(by_name):
        raise ValueError(f"tensors {sorted(set(by_name) - set(ORDER))} have no place in a region")
    return offsets, at


def entry_layout(entry: FactKV, align: int = ALIGN) -> tuple[dict[str, int], int]:
    """:func:`layout` of ``entry``'s tensors."""
    return layout(((name, nbytes(t)) for name, t in entry_tensors(entry).items()), align)


def region_of(
    entry: FactKV, align: int = ALIGN, placed: tuple[dict[str, int], int] | None = None
) -> torch.Tensor | None:
    """The uint8 region (``[size]``, over the tensors' own memory) that holds ``entry``'s
    tensors at :func:`entry_layout`'s offsets (``placed``, if the caller has it), or None if
    they are not laid out so (separate tensors, another alignment, a view that is not
    contiguous)."""
    offsets, size = placed or entry_layout(entry, align)
    k = entry.k
    storage = k.untyped_storage().data_ptr()
    base = k.data_ptr()
    for name, t in entry_tensors(entry).items():
        if (
            t.data_ptr() - base != offsets[name]
            or not t.is_contiguous()
            or t.untyped_storage().data_ptr() != storage
        ):
            return None
    start = base - storage
    if start + size > k.untyped_storage().nbytes():
        return None
    return k.reshape(-1).view(torch.uint8).as_strided((size,), (1,), start)


def views(
    region: torch.Tensor,
    entry: FactKV,
    align: int = ALIGN,
    placed: tuple[dict[str, int], int] | None = None,
) -> FactKV:
    """``entry`` with its tensors replaced by views of ``region`` (uint8, at least
    :func:`entry_layout`'s size) at :func:`entry_layout`'s offsets (``placed``, if the caller
    has it): shapes and dtypes kept."""
    offsets, _ = placed or entry_layout(entry, align)
    # One as_strided per tensor over the region seen as its dtype (one alias per dtype): placing
    # an entry in the pool makes these for every entry of a request's prefetch, six for int4,
    # and slice + view + view cost int4 ~2.5x a plain entry's placement in Python time.
    typed: dict[torch.dtype, torch.Tensor] = {torch.uint8: region}
    made = {}
    for name, t in entry_tensors(entry).items():
        alias = typed.get(t.dtype)
        if alias is None:
            alias = typed[t.dtype] = region.view(t.dtype)
        at = alias.storage_offset() + offsets[name] // t.element_size()
        strides = t.stride() if t.is_contiguous() else _contiguous(t.shape)
        made[name] = alias.as_strided(t.shape, strides, at)
    return with_tensors(entry, made)


def pack(entry: FactKV, pin: bool, align: int = ALIGN) -> FactKV:
    """``entry`` copied into one fresh host region (pinned if ``pin``: that needs CUDA, the
    caller guards). An entry already laid out as a region (e.g. views of the GPU pool) is
    copied in one piece, others tensor by tensor."""
    placed = entry_layout(entry, align)
    region = torch.empty(placed[1], dtype=torch.uint8, pin_memory=pin)  # [size]
    out = views(region, entry, align, placed)
    source = region_of(entry, align, placed)
    if source is not None:
        region.copy_(source)
        return out
    targets = entry_tensors(out)
    for name, t in entry_tensors(entry).items():
        targets[name].copy_(t)
    return out


def _contiguous(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
