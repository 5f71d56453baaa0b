"""The whole injection as one GPU kernel: move the stored keys of every layer to their place
(a rotation by each piece's shift) and write K and V straight into vLLM's paged cache.

The backend path (``worker_side``) rotates each piece and makes one cache write per layer,
moving every byte three times and launching kernels per piece and per layer. Here
one Triton program per ``(token, layer)`` reads the token's K row (and the partner half its
rotation needs) from wherever the entry lives — the GPU pool, or a staged copy — rotates it in
fp32 by its piece's shift with the cos/sin of :func:`~inferscale_core.rope.cos_sin` (one
rounding to the cache dtype; a shift of 0 writes the stored bytes back), and stores K and V at
the token's slot. Every source byte is read once and every
cache byte written once.

Layers' caches are separate allocations, and so are the entries: the kernel takes one base
pointer for each and addresses everything else by signed int64 element offsets from it
(``data_ptr`` differences), so no pointer table is needed. The host describes the request
per piece (a fact's tokens), not per token: five numbers a piece (its shift among them: the
stored keys are post-RoPE at the entry's origin and are rotated by the difference), the block
ids, and each token's piece by ``np.repeat``; the kernel derives every slot and position from
them, so the CPU's share of a load grows with the number of facts, not of tokens. Pure
torch + Triton, no vLLM import: the tests run it on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
import torch

from inferscale_core.kvstore.tiers import EntryLayout
from inferscale_core.load_plan import Piece
from inferscale_core.rope import RopeSpec, cos_sin, pure_rotation
from inferscale_core.vllm_plugin.paged_layouts import CacheGeometry, PagedLayout, cache_geometry

try:  # Triton ships with CUDA builds of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
    from triton.compiler import CompiledKernel
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None
    CompiledKernel = None


log = logging.getLogger(__name__)


def _current_raw_stream(device_index: int | None) -> int:
    """The current CUDA stream's handle, as Triton's own launch path reads it."""
    return torch._C._cuda_getCurrentRawStream(device_index)


def available() -> bool:
    """Whether the fused kernel can run here (Triton importable)."""
    return triton is not None


class SourcePiece(NamedTuple):
    """Tokens ``[src_start, src_end)`` of one stored entry, going to request position
    ``dst_start`` onwards, their keys rotated by ``shift`` positions. (A tuple: one is made
    per fact per request.)"""

    k: torch.Tensor  # [layers, entry_tokens, kv_heads, head_dim] post-RoPE at the entry's origin
    v: torch.Tensor  # [layers, entry_tokens, kv_heads, head_dim], contiguous, same dtype as k
    src_start: int
    src_end: int
    dst_start: int
    shift: int = 0  # place in the prompt - place the keys were computed at


# The request's table, one int64 buffer copied in once: five rows of per-piece descriptors
# (pieces sorted by where they start in the span), each token's piece, and the request's
# block ids. K and V of an entry have the same shape, so one layer stride serves both. The
# kernel reads the rows by these numbers.
_K_OFFSET, _V_OFFSET, _LAYER_STRIDE, _DST_AT, _SHIFT, _PIECE_ROWS = range(6)


if triton is not None:
    # The request's numbers are not specialized on (Triton would otherwise compile variants
    # for values divisible by 16 or equal to 1): one compiled kernel serves every request, so
    # FusedInjector can launch it directly (see ``_launch``).
    @triton.jit(do_not_specialize=["pieces", "reach", "start", "tokens"])
    def _inject_kernel(
        src_k,  # K of the first piece: every piece is addressed by element offsets from it
        src_v,  # V of the first piece, the same way
        table,  # int64 [5 * pieces + tokens + blocks], see _request_table
        pieces,
        dst,  # layer 0's cache; layer l's cache starts layer_offsets[l] elements from it
        layer_offsets,  # int64 [layers]
        cos,  # fp32 [2 * reach, rotary_dim // 2]: row reach + s is a rotation by s positions
        sin,  # fp32 [2 * reach, rotary_dim // 2]
        reach,  # shifts in [-reach, reach) have a row
        start,  # request position of span token 0
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
        p = tl.load(table + 5 * pieces + t)  # this token's piece
        within = t - tl.load(table + 3 * pieces + p)  # token of the piece
        layer_stride = tl.load(table + 2 * pieces + p)
        angle_row = reach + tl.load(table + 4 * pieces + p)  # the piece's shift
        row = within * (HEADS * DIM) + layer * layer_stride
        k_row = tl.load(table + 0 * pieces + p) + row
        v_row = tl.load(table + 1 * pieces + p) + row
        position = start + t
        block_id = tl.load(table + 5 * pieces + tokens + position // block_size)

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
        c = tl.load(cos + angle_row * half + freq, mask=rotated, other=1.0)  # [1, dim]
        s = tl.load(sin + angle_row * half + freq, mask=rotated, other=0.0)
        k_out = x * c + (sign * x_partner) * s  # [heads, dim] fp32; pass-through dims: x

        at = (
            dst
            + tl.load(layer_offsets + layer)
            + block_id * block_stride
            + (position % block_size) * offset_stride
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
        direct_launch: bool = True,  # launch the compiled kernel itself after the first load
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
        self._host_table = torch.empty(0, dtype=torch.int64)  # pinned, reused
        self._host_view = self._host_table.numpy()
        self._device_table = torch.empty(0, dtype=torch.int64, device=self.device)
        self._copied: torch.cuda.Event | None = None  # when the last table copy was done
        self._pool_views: dict[torch.dtype, torch.Tensor] = {}  # a GPU pool as entry dtype
        self._constexprs = {  # the kernel's compile-time parameters, in its signature's order
            "HEADS": kv_heads,
            "DIM": head_dim,
            "HEADS_P2": triton.next_power_of_2(kv_heads),
            "DIM_P2": triton.next_power_of_2(head_dim),
            "ROTARY_DIM": rope.rotary_dim,
            "NEOX": rope.is_neox_style,
        }
        self._compiled: dict[tuple, Any] = {}  # see _launch
        self._direct = direct_launch  # whether _launch may launch compiled kernels itself

    def _stage(
        self, info: np.ndarray, start: int, tokens: int, block_ids: Sequence[int]
    ) -> torch.Tensor:
        """The request's table (see :func:`_request_table`), built in a reused pinned buffer and
        copied asynchronously (a pageable copy would block until the GPU drains)."""
        size = _PIECE_ROWS * len(info) + tokens + len(block_ids)
        host = self._host_buffer(size)
        _request_table(info, start, tokens, block_ids, self.kv_heads * self.head_dim, host)
        return self._copy_table(size)

    def stage_table(self, table: np.ndarray) -> torch.Tensor:
        """An int64 table another kernel of the load reads (``fused_compressed``), copied in
        the same way: through the reused pinned buffer, asynchronously."""
        self._host_buffer(len(table))[: len(table)] = table
        return self._copy_table(len(table))

    def _host_buffer(self, size: int) -> np.ndarray:
        """The pinned host buffer (grown to ``size``), once the last copy out of it is done."""
        if self._device_table.numel() < size:
            capacity = max(16384, 1 << (size - 1).bit_length())
            pin = self.device.type == "cuda"
            self._host_table = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
            self._host_view = self._host_table.numpy()
            self._device_table = torch.empty(capacity, dtype=torch.int64, device=self.device)
            self._copied = None
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the host buffer
        return self._host_view

    def _copy_table(self, size: int) -> torch.Tensor:
        device = self._device_table[:size]
        device.copy_(self._host_table[:size], non_blocking=True)
        if self.device.type == "cuda":
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record()
        return device

    def _tables(self, reach: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """cos/sin of rotations by ``[-R, R)`` positions with ``R >= reach`` (grown by powers
        of two), and R: row ``R + s`` rotates by ``s``. Pure rotations: the stored keys already
        carry any RoPE scaling (yarn's mscale), so it is not applied twice."""
        if self._cos.shape[0] < 2 * reach:
            capacity = max(4096, 1 << (reach - 1).bit_length())
            shifts = torch.arange(-capacity, capacity, dtype=torch.int64, device=self.device)
            tables = cos_sin(pure_rotation(self.rope), shifts)
            self._cos, self._sin = (t.contiguous() for t in tables)
        return self._cos, self._sin, self._cos.shape[0] // 2

    def inject(
        self,
        pieces: Sequence[SourcePiece],
        start: int,
        tokens: int,
        block_ids: Sequence[int],  # the request's block table, from position 0 to at least the end
    ) -> None:
        """Write positions ``[start, start + tokens)``, which ``pieces`` must tile exactly, to
        the slots the block table gives them: block ``block_ids[p // block_size]``, offset
        ``p % block_size``. The pieces may live anywhere on the cache's device."""
        if tokens == 0:
            return
        layers = len(self.caches)
        first = pieces[0]
        k_dtype, v_dtype, device = first.k.dtype, first.v.dtype, self.device
        for piece in pieces:
            k, v = piece.k, piece.v
            shape = k.shape
            if shape[0] != layers or shape[2] != self.kv_heads or shape[3] != self.head_dim:
                raise ValueError(
                    f"stored K {tuple(shape)} does not fit {layers} layers of"
                    f" {self.kv_heads} heads x {self.head_dim}"
                )
            if v.shape != shape:
                raise ValueError("the fused kernel needs V shaped like K")
            if k.dtype is not k_dtype or v.dtype is not v_dtype:
                raise ValueError("the pieces of one request must share their dtypes")
            if k.device != device or v.device != device:
                raise ValueError("stage the pieces on the cache's device first")
            if not (k.is_contiguous() and v.is_contiguous()):
                raise ValueError("the pieces must be contiguous [layers, tokens, heads, dim]")
        info = np.array(  # int64 [pieces, 7], see _request_table
            [
                (
                    p.dst_start,
                    p.src_start,
                    p.src_end,
                    p.k.shape[1],
                    p.k.data_ptr(),
                    p.v.data_ptr(),
                    p.shift,
                )
                for p in pieces
            ],
            dtype=np.int64,
        )
        info[:, 4] -= first.k.data_ptr()
        info[:, 5] -= first.v.data_ptr()
        k_size, v_size = first.k.element_size(), first.v.element_size()
        if (info[:, 4] % k_size).any() or (info[:, 5] % v_size).any():
            raise ValueError("tensor start not aligned to its element size")
        info[:, 4] //= k_size
        info[:, 5] //= v_size
        self._launch(first.k, first.v, info, start, tokens, block_ids)

    def inject_in_place(
        self,
        pool: torch.Tensor,  # uint8 [bytes]: the GPU tier's one buffer
        spans: np.ndarray,  # int64 [pieces, 3]: (K byte offset, V byte offset, entry tokens)
        layout: EntryLayout,  # the entries' (dtype, layers, kv_heads, head_dim)
        pieces: Sequence[Piece],  # each piece's src_start, src_end, dst_start; rows of spans
        start: int,
        tokens: int,
        block_ids: Sequence[int],
    ) -> None:
        """:meth:`inject` for entries that sit in one pool, described by numbers instead of
        tensors (what :meth:`~inferscale_core.kvstore.tiers.DeviceTier.spans` gives): no tensor is
        touched per fact, so the CPU's share stays small at large k."""
        if tokens == 0:
            return
        dtype, layers, heads, dim = layout
        if (layers, heads, dim) != (len(self.caches), self.kv_heads, self.head_dim):
            raise ValueError(
                f"stored entries of {layers} layers x {heads} heads x {dim} do not fit"
                f" {len(self.caches)} layers of {self.kv_heads} heads x {self.head_dim}"
            )
        base = self.pool_view(pool, dtype)
        info = in_place_info(pieces, spans, dtype)
        self._launch(base, base, info, start, tokens, block_ids)

    def pool_view(self, pool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The GPU pool (uint8 [bytes]) seen as ``dtype`` elements, kept per dtype."""
        if pool.device != self.device:
            raise ValueError("the pool is not on the cache's device")
        base = self._pool_views.get(dtype)
        if base is None or base.data_ptr() != pool.data_ptr():
            base = self._pool_views[dtype] = pool[
                : pool.numel() // dtype.itemsize * dtype.itemsize
            ].view(dtype)
        return base

    def _launch(
        self,
        src_k: torch.Tensor,
        src_v: torch.Tensor,
        info: np.ndarray,
        start: int,
        tokens: int,
        block_ids: Sequence[int],
    ) -> None:
        if (start + tokens - 1) // self.geometry.block_size >= len(block_ids):
            raise ValueError(f"{len(block_ids)} blocks do not reach position {start + tokens - 1}")
        table = self._stage(info, start, tokens, block_ids)
        cos, sin, reach = self._tables(int(np.abs(info[:, 6]).max()) + 1)
        g = self.geometry
        args = (
            src_k,
            src_v,
            table,
            len(info),
            self.caches[0],
            self._layer_offsets,
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
        )
        grid = (tokens, len(self.caches), 1)  # a compiled kernel's launcher takes all three
        # What a compiled kernel is specialized on and may differ between requests: the
        # sources' dtypes and 16-byte alignment (every other tensor is this injector's own, and
        # every other number is fixed for it or not specialized on).
        key = (src_k.dtype, src_v.dtype, src_k.data_ptr() % 16 == 0, src_v.data_ptr() % 16 == 0)
        compiled = self._compiled.get(key)
        if compiled is not None:
            # The compiled kernel's own launcher, without Triton's per-call binding,
            # specialization and cache lookup: 27 us against 39 us in a hot loop on the H200's
            # host (Triton's whole launch took 73-120 us inside vLLM's step there).
            try:
                stream = _current_raw_stream(self.device.index)
                compiled[grid](*args, *self._constexprs.values(), stream=stream)
            except Exception as exc:  # a Triton whose launcher differs: its own path from now
                log.warning("launching the compiled injection kernel directly failed: %s", exc)
                self._compiled.clear()
                self._direct = False
                compiled = None
        if compiled is None:
            compiled = _inject_kernel[grid](*args, **self._constexprs, num_warps=4)
            if self._direct and self.device.type == "cuda" and isinstance(compiled, CompiledKernel):
                self._compiled[key] = compiled


# Of a Piece (key, src_start, src_end, dst_start, shift): dst_start, src_start, src_end, shift.
_DST_SRC_START_END_SHIFT = itemgetter(3, 1, 2, 4)


def in_place_info(pieces: Sequence[Piece], spans: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """int64 [pieces, 7] of :func:`_request_table` for entries read in place: each piece's
    dst_start, src_start, src_end (C-level ``itemgetter``), its entry's tokens and K and V
    element offsets from ``spans`` (rows of byte offsets, see ``DeviceTier.spans``), and the
    piece's shift."""
    size = dtype.itemsize
    if (spans[:, :2] % size).any():
        raise ValueError("entry start not aligned to its element size")
    info = np.empty((len(pieces), 7), dtype=np.int64)
    info[:, [0, 1, 2, 6]] = list(map(_DST_SRC_START_END_SHIFT, pieces))
    info[:, 3] = spans[:, 2]
    info[:, 4:6] = spans[:, :2] // size
    return info


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


def _request_table(
    info: np.ndarray,  # int64 [pieces, 7]: dst_start, src_start, src_end, entry tokens, K and V
    #                    element offsets of the entry (layer 0, token 0) from the kernel's
    #                    bases, the piece's shift
    start: int,
    tokens: int,
    block_ids: Sequence[int],
    row_elements: int,  # kv_heads * head_dim: one token of one layer
    table: np.ndarray,  # int64 [5 * pieces + tokens + blocks] or longer, filled here
) -> None:
    """The kernel's table: per piece, in span order, where its first source token's K and V
    rows start, the entry's layer stride, where the piece starts in the span and its shift;
    then each
    span token's piece; then the block ids. Checks that the pieces tile the span exactly once.
    Numpy over the pieces and tokens, no Python loop."""
    count = len(info)
    info = info[np.argsort(info[:, 0], kind="stable")]  # span order
    dst_at, src_start, lengths = info[:, 0] - start, info[:, 1], info[:, 2] - info[:, 1]
    ends = np.cumsum(lengths)
    if (lengths <= 0).any() or ends[-1] != tokens:
        raise ValueError(f"pieces cover {int(lengths.sum())} tokens of a {tokens}-token span")
    if dst_at[0] != 0 or (dst_at[1:] != ends[:-1]).any():
        raise ValueError("the pieces do not tile the request's span exactly once")
    if (info[:, 1] < 0).any() or (info[:, 2] > info[:, 3]).any():
        raise ValueError("a piece reaches outside its entry")
    rows = table[: _PIECE_ROWS * count].reshape(_PIECE_ROWS, count)
    rows[_K_OFFSET] = info[:, 4] + src_start * row_elements
    rows[_V_OFFSET] = info[:, 5] + src_start * row_elements
    rows[_LAYER_STRIDE] = info[:, 3] * row_elements
    rows[_DST_AT] = dst_at
    rows[_SHIFT] = info[:, 6]
    at = _PIECE_ROWS * count
    table[at : at + tokens] = np.repeat(np.arange(count, dtype=np.int64), lengths)
    table[at + tokens : at + tokens + len(block_ids)] = block_ids
