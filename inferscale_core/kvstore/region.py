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

ORDER = ("k", "v", "k_scale", "v_scale", "k_zero", "v_zero")
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
    return with_tensors(
        entry,
        {name: view(region, offsets[name], t) for name, t in entry_tensors(entry).items()},
    )


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


def view(region: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor shaped and typed like ``like`` over ``region[offset:]`` (offset aligned)."""
    return region[offset : offset + nbytes(like)].view(like.dtype).view(like.shape)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
