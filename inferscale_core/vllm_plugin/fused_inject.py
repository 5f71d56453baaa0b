"""The whole injection as one GPU kernel: re-rotate the stored pre-RoPE keys of every layer and
write K and V straight into vLLM's paged cache.

The unfused path makes one copy of all pieces, one rotation pass and one cache write per layer
(``reshape_and_cache_flash``), moving every byte three times and launching ~40 kernels. Here
one Triton program per ``(token, layer)`` reads the token's K row (and the partner half its
rotation needs) from wherever the entry lives — the GPU pool, or a staged copy — rotates it in
fp32 with the same cos/sin table as :func:`~inferscale_core.rope.cos_sin` (one rounding to the
cache dtype), and stores K and V at the token's slot. Every source byte is read once and every
cache byte written once.

Layers' caches are separate allocations, and so are the entries: the kernel takes one base
pointer for each and addresses everything else by signed int64 element offsets from it
(``data_ptr`` differences), so no pointer table is needed. Pure torch + Triton, no vLLM import:
the tests run it on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from inferscale_core.rope import RopeSpec, cos_sin
from inferscale_core.vllm_plugin.paged_layouts import CacheGeometry, PagedLayout, cache_geometry

try:  # Triton ships with CUDA builds of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None


def available() -> bool:
    """Whether the fused kernel can run here (Triton importable)."""
    return triton is not None


class SourcePiece(NamedTuple):
    """Tokens ``[src_start, src_end)`` of one stored entry, going to request position
    ``dst_start`` onwards. (A tuple: one is made per fact per request.)"""

    k: torch.Tensor  # [layers, entry_tokens, kv_heads, head_dim] pre-RoPE, contiguous
    v: torch.Tensor  # [layers, entry_tokens, kv_heads, head_dim], contiguous, same dtype as k
    src_start: int
    src_end: int
    dst_start: int


# Rows of the per-token table the kernel reads (int64 [_ROWS, tokens]).
# K and V of an entry have the same shape, so one layer stride serves both. The kernel reads
# the rows by these numbers.
_K_OFFSET, _V_OFFSET, _LAYER_STRIDE, _SLOT, _POSITION, _ROWS = range(6)


if triton is not None:

    @triton.jit
    def _inject_kernel(
        src_k,  # K of the first piece: every piece is addressed by element offsets from it
        src_v,  # V of the first piece, the same way
        table,  # int64 [5, tokens]: rows _K_OFFSET, _V_OFFSET, _LAYER_STRIDE, _SLOT, _POSITION
        dst,  # layer 0's cache; layer l's cache starts layer_offsets[l] elements from it
        layer_offsets,  # int64 [layers]
        cos,  # fp32 [positions, rotary_dim // 2]
        sin,  # fp32 [positions, rotary_dim // 2]
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
    ):
        t = tl.program_id(0)
        layer = tl.program_id(1).to(tl.int64)
        layer_stride = tl.load(table + 2 * tokens + t)
        k_row = tl.load(table + 0 * tokens + t) + layer * layer_stride
        v_row = tl.load(table + 1 * tokens + t) + layer * layer_stride
        slot = tl.load(table + 3 * tokens + t)
        position = tl.load(table + 4 * tokens + t)

        h = tl.arange(0, HEADS_P2)[:, None]  # [heads, 1]
        d = tl.arange(0, DIM_P2)[None, :]  # [1, dim]
        inside = (h < HEADS) & (d < DIM)  # [heads, dim]
        half: tl.constexpr = ROTARY_DIM // 2
        rotated = d < ROTARY_DIM
        if NEOX:  # halves: y[d] = x[d] c - x[d + half] s ; y[d + half] = x[d + half] c + x[d] s
            partner = tl.where(d < half, d + half, d - half)
            freq = tl.where(d < half, d, d - half)
            sign = tl.where(d < half, -1.0, 1.0)
        else:  # interleaved pairs (GPT-J)
            partner = d ^ 1
            freq = d // 2
            sign = tl.where(d % 2 == 0, -1.0, 1.0)
        x = tl.load(src_k + k_row + h * DIM + d, mask=inside, other=0.0).to(tl.float32)
        x_partner = tl.load(src_k + k_row + h * DIM + partner, mask=inside & rotated, other=0.0).to(
            tl.float32
        )
        c = tl.load(cos + position * half + freq, mask=rotated, other=1.0)  # [1, dim]
        s = tl.load(sin + position * half + freq, mask=rotated, other=0.0)
        k_out = x * c + (sign * x_partner) * s  # [heads, dim] fp32; pass-through dims: x

        block = slot // block_size
        at = (
            dst
            + tl.load(layer_offsets + layer)
            + block * block_stride
            + (slot - block * block_size) * offset_stride
            + h * head_stride
            + d * dim_stride
        )
        tl.store(at, k_out.to(dst.dtype.element_ty), mask=inside)
        v = tl.load(src_v + v_row + h * DIM + d, mask=inside, other=0.0)
        tl.store(at + v_offset, v.to(dst.dtype.element_ty), mask=inside)


class FusedInjector:
    """Writes re-rotated K and V of all layers into a set of paged caches with one kernel.

    Made once per set of caches (the layers of one engine); :meth:`inject` per request.
    """

    def __init__(
        self,
        caches: Sequence[torch.Tensor],  # one paged cache per layer, all alike, in layer order
        layout: PagedLayout,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        rope: RopeSpec,
    ) -> None:
        if triton is None:
            raise RuntimeError("the fused injection kernel needs Triton")
        first = caches[0]
        for cache in caches:
            if (cache.shape, cache.stride(), cache.dtype, cache.device) != (
                first.shape,
                first.stride(),
                first.dtype,
                first.device,
            ):
                raise ValueError("the fused kernel needs every layer's cache alike")
        if rope.head_dim != head_dim or rope.rotary_dim % 2:
            raise ValueError(f"RoPE of head_dim {rope.head_dim} for keys of {head_dim}")
        self.caches = list(caches)
        self.geometry: CacheGeometry = cache_geometry(first, layout, block_size)
        self.kv_heads, self.head_dim, self.rope = kv_heads, head_dim, rope
        self.device = first.device
        self._layer_offsets = torch.tensor(
            _element_offsets(first, self.caches), dtype=torch.int64, device=self.device
        )  # [layers]
        self._cos = self._sin = torch.empty(0, rope.rotary_dim // 2)
        self._host_table = torch.empty(0, dtype=torch.int64)  # pinned, [5 * tokens] reused
        self._device_table = torch.empty(0, dtype=torch.int64, device=self.device)
        self._copied: torch.cuda.Event | None = None  # when the last table copy was done

    def _stage(
        self, pieces: Sequence[SourcePiece], first: SourcePiece, start: int, slots: Sequence[int]
    ) -> torch.Tensor:
        """The per-token table, built in a reused pinned buffer and copied asynchronously
        (a pageable copy would block until the GPU drains)."""
        tokens = len(slots)
        size = _ROWS * tokens
        if self._device_table.numel() < size:
            capacity = max(_ROWS * 4096, 1 << (size - 1).bit_length())
            pin = self.device.type == "cuda"
            self._host_table = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
            self._device_table = torch.empty(capacity, dtype=torch.int64, device=self.device)
            self._copied = None
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the host buffer
        host = self._host_table[:size].view(_ROWS, tokens)
        _token_table(pieces, first, start, slots, self.kv_heads * self.head_dim, host.numpy())
        device = self._device_table[:size].view(_ROWS, tokens)
        device.copy_(host, non_blocking=True)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        return device

    def _tables(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions ``[0, end)`` at least, grown by powers of two."""
        if self._cos.shape[0] < end:
            capacity = max(4096, 1 << (end - 1).bit_length())
            positions = torch.arange(capacity, dtype=torch.int64, device=self.device)
            self._cos, self._sin = (t.contiguous() for t in cos_sin(self.rope, positions))
        return self._cos, self._sin

    def inject(
        self,
        pieces: Sequence[SourcePiece],
        start: int,
        slots: Sequence[int],  # the request's slot of each position in [start, start + len)
    ) -> None:
        """Write positions ``[start, start + len(slots))``, which ``pieces`` must tile exactly."""
        tokens = len(slots)
        if tokens == 0:
            return
        layers = len(self.caches)
        first = pieces[0]
        for piece in pieces:
            if piece.k.shape[0] != layers or piece.k.shape[2:] != (self.kv_heads, self.head_dim):
                raise ValueError(
                    f"stored K {tuple(piece.k.shape)} does not fit {layers} layers of"
                    f" {self.kv_heads} heads x {self.head_dim}"
                )
            if piece.v.shape != piece.k.shape:
                raise ValueError("the fused kernel needs V shaped like K")
            if piece.k.dtype != first.k.dtype or piece.v.dtype != first.v.dtype:
                raise ValueError("the pieces of one request must share their dtypes")
            if piece.k.device != self.device or piece.v.device != self.device:
                raise ValueError("stage the pieces on the cache's device first")
            if not (piece.k.is_contiguous() and piece.v.is_contiguous()):
                raise ValueError("the pieces must be contiguous [layers, tokens, heads, dim]")
        table = self._stage(pieces, first, start, slots)  # int64 [5, tokens] on the device
        cos, sin = self._tables(start + tokens)
        g = self.geometry
        _inject_kernel[(tokens, layers)](
            first.k,
            first.v,
            table,
            self.caches[0],
            self._layer_offsets,
            cos,
            sin,
            tokens,
            g.block_size,
            g.block_stride,
            g.offset_stride,
            g.head_stride,
            g.dim_stride,
            g.v_offset,
            HEADS=self.kv_heads,
            DIM=self.head_dim,
            HEADS_P2=triton.next_power_of_2(self.kv_heads),
            DIM_P2=triton.next_power_of_2(self.head_dim),
            ROTARY_DIM=self.rope.rotary_dim,
            NEOX=self.rope.is_neox_style,
            num_warps=4,
        )


def _element_offsets(base: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[int]:
    """Each tensor's first element, in elements of ``base``'s dtype from ``base``'s."""
    size = base.element_size()
    offsets = []
    for t in tensors:
        delta = t.data_ptr() - base.data_ptr()
        if delta % size:
            raise ValueError("tensor start not aligned to its element size")
        offsets.append(delta // size)
    return offsets


def _token_table(
    pieces: Sequence[SourcePiece],
    first: SourcePiece,
    start: int,
    slots: Sequence[int],
    row_elements: int,  # kv_heads * head_dim: one token of one layer
    table: np.ndarray,  # int64 [5, tokens], filled here
) -> None:
    """Per request position: where its K and V rows start (layer 0), the entry's layer
    stride, its slot and its position. Checks that the pieces tile the span."""
    tokens = len(slots)
    lengths = np.array([p.src_end - p.src_start for p in pieces], dtype=np.int64)  # [pieces]
    if (lengths <= 0).any() or lengths.sum() != tokens:
        raise ValueError(f"pieces cover {int(lengths.sum())} tokens for {tokens} slots")
    k_base = np.array(_element_offsets(first.k, [p.k for p in pieces]), dtype=np.int64)
    v_base = np.array(_element_offsets(first.v, [p.v for p in pieces]), dtype=np.int64)
    entry_tokens = np.array([p.k.shape[1] for p in pieces], dtype=np.int64)
    src_start = np.array([p.src_start for p in pieces], dtype=np.int64)
    dst_at = np.array([p.dst_start - start for p in pieces], dtype=np.int64)
    piece_of = np.repeat(np.arange(len(pieces)), lengths)  # [tokens]
    within = np.arange(tokens, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    column = dst_at[piece_of] + within  # each token's request position, minus start
    if column.min() < 0 or column.max() >= tokens or np.bincount(column).max() != 1:
        raise ValueError("the pieces do not tile the request's span exactly once")
    source_token = src_start[piece_of] + within
    table[_K_OFFSET, column] = k_base[piece_of] + source_token * row_elements
    table[_V_OFFSET, column] = v_base[piece_of] + source_token * row_elements
    table[_LAYER_STRIDE, column] = entry_tokens[piece_of] * row_elements
    table[_SLOT] = np.asarray(slots, dtype=np.int64)
    table[_POSITION] = np.arange(start, start + tokens, dtype=np.int64)
