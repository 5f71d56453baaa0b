"""The one-kernel injection for requests whose entries are compressed (fp8 or int4 codes with
their scales, :mod:`inferscale_core.kvstore.quant`), beside plain ones (the system prefix).

Expanding each entry with torch before :mod:`.fused_inject`'s kernel launched about a dozen
small kernels an entry (14 ms more than plain entries at k=50 on the H200). Here one Triton
program per ``(token, layer)`` reads the token's codes and their scales, expands them in fp32,
rotates the key by its piece's shift and writes K and V at the token's slot, as the plain
kernel does with stored values: the codes are read once, the cache written once. A piece is
plain or compressed (a per-piece flag); the compressed ones of a request share one scheme.

Addressing as in :mod:`.fused_inject`: one base pointer per kind of tensor (plain K, plain V,
codes K, codes V, and the four scale tensors), every piece by signed element offsets from
them. Layouts (per entry, contiguous): codes ``[layers, tokens, heads, D]`` (fp8) or
``[layers, tokens, heads, D/2]`` (int4: channel ``c < D/2`` in the low nibble of byte ``c``,
``c + D/2`` in the high one); key scales ``[layers, 1, heads, D]``; value scales
``[layers, tokens, heads, G]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from inferscale_core.kvstore.tiers import MixedSpans
from inferscale_core.load_plan import Piece
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin.fused_inject import (
    _DST_SRC_START_END_SHIFT,
    FusedInjector,
    triton,
)

if triton is not None:
    import triton.language as tl

SCHEMES = {"fp8": 1, "int4": 2}

# Per-piece rows of the request's table, then each token's piece, then the block ids.
(
    _K_OFF,  # plain: K element offset of (layer 0, src_start); compressed: the codes'
    _V_OFF,
    _TOKENS,  # the entry's tokens (its layer stride follows)
    _DST_AT,  # where the piece starts in the span
    _SHIFT,
    _QUANT,  # 0 plain, 1 compressed
    _KS_OFF,  # key scale of (layer 0, head 0, channel 0)
    _KZ_OFF,
    _VS_OFF,  # value scale of (layer 0, src_start, head 0, group 0)
    _VZ_OFF,
    _KF_OFF,  # int4: the 8-bit key channels' low bits of (layer 0, src_start)
    _KL_OFF,  # int4: their slots (layer 0, head 0, channel 0)
    _FINE,  # 1: the piece has 8-bit key channels (offsets are signed: no sentinel)
    _ROWS,
) = range(14)


class StoredPiece(NamedTuple):
    """Tokens ``[src_start, src_end)`` of an entry on the cache's device (plain or compressed),
    going to request position ``dst_start`` onwards, keys rotated by ``shift``."""

    entry: FactKV
    src_start: int
    src_end: int
    dst_start: int
    shift: int = 0


if triton is not None:

    @triton.jit(do_not_specialize=["pieces", "reach", "start", "tokens"])
    def _inject_mixed_kernel(
        plain_k,
        plain_v,
        code_k,
        code_v,
        k_scale,
        k_zero,
        v_scale,
        v_zero,
        k_fine,
        k_slot,
        table,
        pieces,
        dst,
        layer_offsets,
        cos,
        sin,
        reach,
        start,
        tokens,
        block_size,
        block_stride,
        offset_stride,
        head_stride,
        dim_stride,
        v_offset,
        HEADS: tl.constexpr,
        DIM: tl.constexpr,
        HEADS_P2: tl.constexpr,
        DIM_P2: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        NEOX: tl.constexpr,
        SCHEME: tl.constexpr,  # 1 fp8, 2 int4 (of the compressed pieces)
        GROUPS: tl.constexpr,  # value scales per head
        WIDE: tl.constexpr,  # int4 key channels in 8 bits per head (0: none)
    ):
        t = tl.program_id(0)
        layer = tl.program_id(1).to(tl.int64)
        p = tl.load(table + 13 * pieces + t)
        within = t - tl.load(table + 3 * pieces + p)
        entry_tokens = tl.load(table + 2 * pieces + p)
        angle_row = reach + tl.load(table + 4 * pieces + p)
        quant = tl.load(table + 5 * pieces + p)
        k_off = tl.load(table + 0 * pieces + p)
        v_off = tl.load(table + 1 * pieces + p)
        position = start + t
        block_id = tl.load(table + 13 * pieces + tokens + position // block_size)

        h = tl.arange(0, HEADS_P2)[:, None]  # [heads, 1]
        d = tl.arange(0, DIM_P2)[None, :]  # [1, dim]
        inside = (h < HEADS) & (d < DIM)
        half: tl.constexpr = ROTARY_DIM // 2
        rotated = d < ROTARY_DIM
        if NEOX:
            partner = tl.where(d < half, d + half, d - half)
            freq = tl.where(d < half, d, d - half)
            sign = tl.where(d < half, -1.0, 1.0)
        else:
            partner = d ^ 1
            freq = d // 2
            sign = tl.where(d % 2 == 0, -1.0, 1.0)
        c = tl.load(cos + angle_row * half + freq, mask=rotated, other=1.0)
        s = tl.load(sin + angle_row * half + freq, mask=rotated, other=0.0)

        if quant == 0:
            plain_row = within * (HEADS * DIM) + layer * (entry_tokens * HEADS * DIM)
            plain_at = plain_k + k_off + plain_row + h * DIM
            x = tl.load(plain_at + d, mask=inside, other=0.0).to(tl.float32)
            xp = tl.load(plain_at + partner, mask=inside & rotated, other=0.0).to(tl.float32)
            v = tl.load(plain_v + v_off + plain_row + h * DIM + d, mask=inside, other=0.0)
            v = v.to(tl.float32)
        else:
            ks_at = k_scale + tl.load(table + 6 * pieces + p) + layer * (HEADS * DIM) + h * DIM
            vs_row = (
                tl.load(table + 8 * pieces + p)
                + layer * (entry_tokens * HEADS * GROUPS)
                + within * (HEADS * GROUPS)
                + h * GROUPS
            )
            group = d // (DIM // GROUPS)
            if SCHEME == 2:  # int4: two codes a byte
                hd: tl.constexpr = DIM // 2
                row = within * (HEADS * hd) + layer * (entry_tokens * HEADS * hd)
                nibbles_at = code_k + k_off + row + h * hd
                kz_at = k_zero + tl.load(table + 7 * pieces + p) + layer * (HEADS * DIM) + h * DIM
                byte = tl.load(nibbles_at + d % hd, mask=inside, other=0).to(tl.int32)
                x = ((byte >> (4 * (d // hd))) & 15).to(tl.float32)
                ks_d = tl.load(ks_at + d, mask=inside, other=0.0).to(tl.float32)
                x = x * ks_d + tl.load(kz_at + d, mask=inside, other=0.0).to(tl.float32)
                pbyte = tl.load(nibbles_at + partner % hd, mask=inside & rotated, other=0).to(
                    tl.int32
                )
                xp = ((pbyte >> (4 * (partner // hd))) & 15).to(tl.float32)
                ks_p = tl.load(ks_at + partner, mask=inside & rotated, other=0.0).to(tl.float32)
                xp = xp * ks_p + tl.load(kz_at + partner, mask=inside & rotated, other=0.0).to(
                    tl.float32
                )
                if WIDE > 0:  # the 8-bit channels: add their low 4 bits, each a step (scale/16)
                    kf_off = tl.load(table + 10 * pieces + p)
                    if tl.load(table + 12 * pieces + p) != 0:
                        wh: tl.constexpr = WIDE // 2
                        fine_at = (
                            k_fine
                            + kf_off
                            + within * (HEADS * wh)
                            + layer * (entry_tokens * HEADS * wh)
                            + h * wh
                        )
                        slots_at = (
                            k_slot
                            + tl.load(table + 11 * pieces + p)
                            + layer * (HEADS * DIM)
                            + h * DIM
                        )
                        sl = tl.load(slots_at + d, mask=inside, other=255).to(tl.int32)
                        fine = tl.load(fine_at + sl % wh, mask=inside & (sl < 255), other=0)
                        low = ((fine.to(tl.int32) >> (4 * (sl // wh))) & 15).to(tl.float32)
                        x += tl.where(sl < 255, low * ks_d * 0.0625, 0.0)
                        slp = tl.load(slots_at + partner, mask=inside & rotated, other=255)
                        slp = slp.to(tl.int32)
                        pfine = tl.load(fine_at + slp % wh, mask=inside & (slp < 255), other=0)
                        plow = ((pfine.to(tl.int32) >> (4 * (slp // wh))) & 15).to(tl.float32)
                        xp += tl.where(slp < 255, plow * ks_p * 0.0625, 0.0)
                vbyte = tl.load(code_v + v_off + row + h * hd + d % hd, mask=inside, other=0)
                v = ((vbyte.to(tl.int32) >> (4 * (d // hd))) & 15).to(tl.float32)
                vz_row = (
                    tl.load(table + 9 * pieces + p)
                    + layer * (entry_tokens * HEADS * GROUPS)
                    + within * (HEADS * GROUPS)
                    + h * GROUPS
                )
                v = v * tl.load(v_scale + vs_row + group, mask=inside, other=0.0).to(
                    tl.float32
                ) + tl.load(v_zero + vz_row + group, mask=inside, other=0.0).to(tl.float32)
            else:  # fp8 e4m3
                row = within * (HEADS * DIM) + layer * (entry_tokens * HEADS * DIM)
                fp8_at = code_k + k_off + row + h * DIM
                x = tl.load(fp8_at + d, mask=inside, other=0.0).to(tl.float32)
                x = x * tl.load(ks_at + d, mask=inside, other=0.0).to(tl.float32)
                xp = tl.load(fp8_at + partner, mask=inside & rotated, other=0.0).to(tl.float32)
                xp = xp * tl.load(ks_at + partner, mask=inside & rotated, other=0.0).to(tl.float32)
                v = tl.load(code_v + v_off + row + h * DIM + d, mask=inside, other=0.0)
                v = v.to(tl.float32) * tl.load(v_scale + vs_row + group, mask=inside, other=0.0)

        k_out = x * c + (sign * xp) * s
        at = (
            dst
            + tl.load(layer_offsets + layer)
            + block_id * block_stride
            + (position % block_size) * offset_stride
            + h * head_stride
            + d * dim_stride
        )
        tl.store(at, k_out.to(dst.dtype.element_ty), mask=inside)
        tl.store(at + v_offset, v.to(dst.dtype.element_ty), mask=inside)


def inject_mixed(
    injector: FusedInjector,
    pieces: Sequence[StoredPiece],
    start: int,
    tokens: int,
    block_ids: Sequence[int],
) -> None:
    """Write positions ``[start, start + tokens)`` from ``pieces`` (which tile them exactly),
    plain and compressed alike, with one kernel. Every tensor must be on the cache's device
    and contiguous; the compressed pieces must share one scheme."""
    if tokens == 0:
        return
    plain = [p.entry for p in pieces if p.entry.quant is None]
    packed = [p.entry for p in pieces if p.entry.quant is not None]
    if not packed:
        raise ValueError("no compressed piece: use FusedInjector.inject")
    schemes = {e.quant.scheme for e in packed}  # type: ignore[union-attr]
    if len(schemes) != 1:
        raise ValueError(f"the compressed pieces of one request mix schemes: {sorted(schemes)}")
    scheme = schemes.pop()
    layers = len(injector.caches)
    heads, dim = injector.kv_heads, injector.head_dim
    for e in plain + packed:
        shape = (e.k.shape[0], e.k.shape[2], e.quant.k_dim if e.quant else e.k.shape[3])
        if shape != (layers, heads, dim):
            raise ValueError(f"stored K {tuple(e.k.shape)} does not fit {layers}x{heads}x{dim}")
    tensors = [t for e in plain + packed for t in _tensors(e)]
    if any(t.device != injector.device or not t.is_contiguous() for t in tensors):
        raise ValueError("stage the pieces, contiguous, on the cache's device first")
    first = packed[0]
    q = first.quant
    assert q is not None
    bases = {
        "plain_k": plain[0].k if plain else first.k,  # a placeholder when there is none
        "plain_v": plain[0].v if plain else first.v,
        "code_k": first.k,
        "code_v": first.v,
        "k_scale": q.k_scale,
        "k_zero": q.k_zero if q.k_zero is not None else q.k_scale,
        "v_scale": q.v_scale,
        "v_zero": q.v_zero if q.v_zero is not None else q.v_scale,
        "k_fine": first.k,  # placeholders unless a piece has 8-bit key channels
        "k_slot": first.k,
    }
    fine = next((e.quant for e in packed if e.quant.k_fine is not None), None)  # type: ignore[union-attr]
    if fine is not None:
        bases["k_fine"], bases["k_slot"] = fine.k_fine, fine.k_slot
    wide = 0 if fine is None else 2 * fine.k_fine.shape[-1]  # type: ignore[union-attr]
    groups = q.v_scale.shape[-1]
    codes_per_row = dim // 2 if scheme == "int4" else dim
    info = np.zeros((len(pieces), _ROWS), dtype=np.int64)
    for i, piece in enumerate(pieces):
        e = piece.entry
        info[i, _TOKENS] = e.k.shape[1]
        info[i, _DST_AT] = piece.dst_start - start
        info[i, _SHIFT] = piece.shift
        if e.quant is None:
            info[i, _K_OFF] = _offset(e.k, bases["plain_k"]) + piece.src_start * heads * dim
            info[i, _V_OFF] = _offset(e.v, bases["plain_v"]) + piece.src_start * heads * dim
            continue
        eq = e.quant
        info[i, _QUANT] = 1
        at = piece.src_start * heads * codes_per_row
        info[i, _K_OFF] = _offset(e.k, bases["code_k"]) + at
        info[i, _V_OFF] = _offset(e.v, bases["code_v"]) + at
        info[i, _KS_OFF] = _offset(eq.k_scale, bases["k_scale"])
        info[i, _VS_OFF] = _offset(eq.v_scale, bases["v_scale"]) + piece.src_start * heads * groups
        if eq.k_zero is not None and eq.v_zero is not None:
            info[i, _KZ_OFF] = _offset(eq.k_zero, bases["k_zero"])
            info[i, _VZ_OFF] = (
                _offset(eq.v_zero, bases["v_zero"]) + piece.src_start * heads * groups
            )
        if eq.k_fine is not None and eq.k_slot is not None:
            if 2 * eq.k_fine.shape[-1] != wide:
                raise ValueError("the compressed pieces of one request have 8-bit key channels")
            at = piece.src_start * heads * (wide // 2)
            info[i, _KF_OFF] = _offset(eq.k_fine, bases["k_fine"]) + at
            info[i, _KL_OFF] = _offset(eq.k_slot, bases["k_slot"])
            info[i, _FINE] = 1
    lengths = np.array([p.src_end - p.src_start for p in pieces], dtype=np.int64)
    _launch(injector, bases, info, lengths, start, tokens, block_ids, scheme, groups, wide)


def inject_mixed_in_place(
    injector: FusedInjector,
    spans: MixedSpans,  # where the pieces' entries sit in the GPU pool, a row per piece
    pieces: Sequence[Piece],
    start: int,
    tokens: int,
    block_ids: Sequence[int],
) -> None:
    """:func:`inject_mixed` for entries that sit in the GPU pool, described by numbers
    (``DeviceTier.mixed_spans``): the table is computed with numpy over the pieces, no tensor
    is touched per fact (at k=50 x 100 requests a Python pass over the pieces' tensors cost
    ~1.3 s of a step's host time)."""
    if tokens == 0:
        return
    scheme, code_dtype, scale_dtype, layers, heads, dim, groups, wide = spans.packed
    if (layers, heads, dim) != (len(injector.caches), injector.kv_heads, injector.head_dim):
        raise ValueError(
            f"stored entries of {layers} layers x {heads} heads x {dim} do not fit"
            f" {len(injector.caches)} layers of {injector.kv_heads} heads x {injector.head_dim}"
        )
    rows = spans.rows
    if len(rows) != len(pieces):
        raise ValueError(f"{len(rows)} spans for {len(pieces)} pieces")
    plain_dtype = spans.plain[0] if spans.plain is not None else injector.caches[0].dtype
    pool = spans.pool
    bases = {
        "plain_k": injector.pool_view(pool, plain_dtype),
        "plain_v": injector.pool_view(pool, plain_dtype),
        "code_k": injector.pool_view(pool, code_dtype),
        "code_v": injector.pool_view(pool, code_dtype),
        "k_scale": injector.pool_view(pool, scale_dtype),
        "k_zero": injector.pool_view(pool, scale_dtype),
        "v_scale": injector.pool_view(pool, scale_dtype),
        "v_zero": injector.pool_view(pool, scale_dtype),
        "k_fine": injector.pool_view(pool, torch.uint8),
        "k_slot": injector.pool_view(pool, torch.uint8),
    }
    where = np.array(list(map(_DST_SRC_START_END_SHIFT, pieces)), dtype=np.int64)
    where = where.reshape(len(pieces), 4)
    src = where[:, 1]
    quant = rows[:, 3]
    size = np.where(quant == 1, code_dtype.itemsize, plain_dtype.itemsize)
    if (rows[:, :2] % size[:, None]).any() or (rows[:, 4:8] % scale_dtype.itemsize).any():
        raise ValueError("entry start not aligned to its element size")
    if (src < 0).any() or (where[:, 2] > rows[:, 2]).any():
        raise ValueError("a piece reaches outside its entry")
    codes_per_row = dim // 2 if scheme == "int4" else dim
    row_elements = np.where(quant == 1, heads * codes_per_row, heads * dim)
    info = np.zeros((len(pieces), _ROWS), dtype=np.int64)
    info[:, _K_OFF] = rows[:, 0] // size + src * row_elements
    info[:, _V_OFF] = rows[:, 1] // size + src * row_elements
    info[:, _TOKENS] = rows[:, 2]
    info[:, _DST_AT] = where[:, 0] - start
    info[:, _SHIFT] = where[:, 3]
    info[:, _QUANT] = quant
    scale_size = scale_dtype.itemsize
    info[:, _KS_OFF] = rows[:, 4] // scale_size
    info[:, _KZ_OFF] = rows[:, 5] // scale_size
    info[:, _VS_OFF] = rows[:, 6] // scale_size + src * heads * groups * quant
    info[:, _VZ_OFF] = rows[:, 7] // scale_size + src * heads * groups * quant
    fine = rows[:, 8] >= 0  # uint8 tensors: byte offsets are element offsets
    info[:, _KF_OFF] = np.where(fine, rows[:, 8] + src * heads * (wide // 2), 0)
    info[:, _KL_OFF] = np.where(fine, rows[:, 9], 0)
    info[:, _FINE] = fine
    lengths = where[:, 2] - src
    _launch(injector, bases, info, lengths, start, tokens, block_ids, scheme, groups, wide)


def _launch(
    injector: FusedInjector,
    bases: dict[str, torch.Tensor],  # plain K, V, codes K, V, the four scales, fine, slots
    info: np.ndarray,  # int64 [pieces, _ROWS] (in any order)
    lengths: np.ndarray,  # int64 [pieces]: each piece's tokens
    start: int,
    tokens: int,
    block_ids: Sequence[int],
    scheme: str,
    groups: int,
    wide: int = 0,
) -> None:
    """Check that the pieces tile the span, lay out the kernel's table and launch it."""
    order = np.argsort(info[:, _DST_AT], kind="stable")
    info, lengths = info[order], lengths[order]
    ends = np.cumsum(lengths)
    if (
        (lengths <= 0).any()
        or ends[-1] != tokens
        or info[0, _DST_AT] != 0
        or (info[1:, _DST_AT] != ends[:-1]).any()
    ):
        raise ValueError("the pieces do not tile the request's span exactly once")
    if (start + tokens - 1) // injector.geometry.block_size >= len(block_ids):
        raise ValueError(f"{len(block_ids)} blocks do not reach position {start + tokens - 1}")
    table = np.concatenate(
        [
            info.T.reshape(-1),
            np.repeat(np.arange(len(info), dtype=np.int64), lengths),
            np.asarray(block_ids, dtype=np.int64),
        ]
    )
    device_table = injector.stage_table(table)  # pinned and asynchronous, as the plain load
    cos, sin, reach = injector._tables(int(np.abs(info[:, _SHIFT]).max()) + 1)
    g = injector.geometry
    _inject_mixed_kernel[(tokens, len(injector.caches), 1)](
        *bases.values(),
        device_table,
        len(info),
        injector.caches[0],
        injector._layer_offsets,
        cos,
        sin,
        reach,
        start,
        tokens,
        g.block_size,
        g.block_stride,
        g.offset_stride,
        g.head_stride,
        g.dim_stride,
        g.v_offset,
        **injector._constexprs,
        SCHEME=SCHEMES[scheme],
        GROUPS=groups,
        WIDE=wide,
        num_warps=4,
    )


def _tensors(entry: FactKV) -> list[torch.Tensor]:
    q = entry.quant
    scales = () if q is None else (q.k_scale, q.k_zero, q.v_scale, q.v_zero, q.k_fine, q.k_slot)
    return [entry.k, entry.v, *(t for t in scales if t is not None)]


def _offset(t: torch.Tensor, base: torch.Tensor) -> int:
    """``t``'s first element in elements of ``base``'s dtype from ``base``'s first."""
    if t.dtype != base.dtype:
        raise ValueError(f"a {t.dtype} tensor among {base.dtype} ones of the same kind")
    delta = t.data_ptr() - base.data_ptr()
    if delta % t.element_size():
        raise ValueError("tensor start not aligned to its element size")
    return delta // t.element_size()
