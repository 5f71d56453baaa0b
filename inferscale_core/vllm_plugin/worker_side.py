"""Worker side of the connector: move stored keys to their place and write them into the
cache before the forward (loads); copy computed spans out of it after the forward (captures,
:mod:`.capture`).

Two ways to write, chosen once per engine (``kv_write``):

* ``"fused"`` (CUDA): one Triton kernel re-rotates the keys of every layer and writes K and V
  straight from the stored entries into the paged cache (:mod:`.fused_inject`), for the layouts
  ``paged_layouts`` knows (vLLM 0.26 FLASH_ATTN / FLASHINFER / TRITON_ATTN). Entries already in
  the GPU pool are read where they sit; others are staged on the device first.
* ``"backend"``: re-rotation with :func:`~inferscale_core.rope.shift` and the attention
  backend's own cache update (``layer.impl.do_kv_cache_update``), the call the forward pass
  makes, so every layout (the CPU backend's ISA-packed keys included) is written as the backend
  expects it.
* ``"auto"`` (default): ``"fused"`` where it applies, else ``"backend"``.

The load is synchronous, before the forward, and never touches
``forward_context.attn_metadata`` (None under full CUDA graphs).

Under tensor parallelism this runs once per rank, and each rank's cache holds only its own KV
heads (:mod:`inferscale_core.tp_heads`): a load writes that rank's heads of the stored
all-heads entries, through the backend (the one-kernel writer reads whole entries), and a
capture writes them as one part of the entry (:meth:`KVStore.put_heads`), which the store joins
once every rank's part is in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from inferscale_core.kvstore import KVStore
from inferscale_core.kvstore.quant import (
    dequantize,
    dequantize_into,
    entry_tensors,
    with_tensors,
)
from inferscale_core.kvstore.tiers import MixedSpans
from inferscale_core.model_spec import ModelSpec
from inferscale_core.openmp_threads import SplitThreads
from inferscale_core.rope import RopeSpec, cos_sin, pure_rotation, shift
from inferscale_core.tp_heads import RankHeads, rank_heads, slice_heads
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin import fused_inject
from inferscale_core.vllm_plugin.capture import CacheReader, EntryWriter, capture
from inferscale_core.vllm_plugin.fp8_cache import fp8_format, scales, typed
from inferscale_core.vllm_plugin.fused_compressed import (
    StoredPiece,
    inject_mixed,
    inject_mixed_in_place,
)
from inferscale_core.vllm_plugin.fused_inject import FusedInjector, SourcePiece
from inferscale_core.vllm_plugin.metadata import InjectionMetadata, LoadOp
from inferscale_core.vllm_plugin.paged_layouts import (
    PagedLayout,
    UnknownLayoutError,
    detect_layout,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

# GPU attention backends whose paged cache layouts paged_layouts.py knows (vLLM 0.26).
_FUSED_BACKENDS = frozenset({"FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"})

KV_WRITE_MODES = ("auto", "fused", "backend")


@dataclass(slots=True)
class LoadStats:
    """What the worker has loaded so far: counts only (benchmarks time it from outside)."""

    loads: int = 0  # requests loaded
    tokens: int = 0  # positions written
    fused: int = 0  # loads written by the one-kernel path
    in_place: int = 0  # of those, read where the entries sit in the GPU pool
    captured: int = 0  # entries copied out of the cache (encoding requests)
    capture_errors: int = 0  # captures that failed (logged; the encoder then times out)


def tensor_parallel(vllm_config: VllmConfig) -> tuple[int, int]:
    """This worker's ``(rank, size)`` in its tensor-parallel group, as vLLM's own connectors
    ask for it (``get_tensor_model_parallel_rank``: the rank within the TP group, not
    ``parallel_config.rank``, which counts pipeline stages too). vLLM sets the group up before
    it builds the connector's worker side (vLLM 0.32 ``gpu_worker.py``: ``init_device``, then
    ``initialize_from_config`` → ``ensure_kv_transfer_initialized``); without a group (an
    engine built by hand) the configured size must be 1."""
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        model_parallel_is_initialized,
    )

    if model_parallel_is_initialized():
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    size = vllm_config.parallel_config.tensor_parallel_size
    if size != 1:
        raise RuntimeError(f"tensor parallel size {size}, but vLLM's TP group is not set up")
    return 0, 1


def attention_layers(vllm_config: VllmConfig) -> list[tuple[str, Any]]:
    """The model's attention layers that own a KV cache, in layer order."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.models.utils import extract_layer_index

    context = vllm_config.compilation_config.static_forward_context
    layers = [
        (name, layer)
        for name, layer in context.items()
        if isinstance(layer, Attention)
        and getattr(layer, "kv_sharing_target_layer_name", None) is None
    ]
    return sorted(layers, key=lambda item: extract_layer_index(item[0]))


class InjectionWorker:
    """Executes the step's :class:`LoadOp` list before the forward, as rank ``tp_rank`` of a
    tensor-parallel group of ``tp_size`` (its own KV heads of each entry)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        store: KVStore,
        spec: ModelSpec,
        kv_write: str = "auto",
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        if kv_write not in KV_WRITE_MODES:
            modes = ", ".join(KV_WRITE_MODES)
            raise ValueError(f"kv_write must be one of {modes}, got {kv_write!r}")
        self.kv_write = kv_write
        self.vllm_config = vllm_config
        self.store = store
        self.spec = spec
        self.heads: RankHeads = rank_heads(spec.num_kv_heads, tp_rank, tp_size)
        self.block_size = vllm_config.cache_config.block_size
        # An fp8 cache: its format (entries are kept in it), and the dtype its update takes.
        self._fp8 = fp8_format(str(vllm_config.cache_config.cache_dtype))
        self._model_dtype: torch.dtype = vllm_config.model_config.dtype
        self.stats = LoadStats()
        self._layers: list[tuple[str, Any]] | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._threads = SplitThreads()  # a CPU load's parts, one core each (openmp_threads)
        self._injector: FusedInjector | None = None
        self._rotary_kernel: VllmRotary | bool | None = None  # False: this vLLM has none
        self._mixed_kernel = True  # compressed entries through fused_compressed's kernel
        self._reader: CacheReader | None = None  # made on the first capture
        self._writer: EntryWriter | None = None
        # Runs of layers that share one RoPE: [(rope, first layer, end layer)].
        runs: list[tuple[Any, int, int]] = []
        for index, rope in enumerate(spec.layer_rope):
            if runs and runs[-1][0] == rope:
                runs[-1] = (rope, runs[-1][1], index + 1)
            else:
                runs.append((rope, index, index + 1))
        self._rope_runs = runs
        if tp_size > 1:
            heads = self.heads
            log.info(
                "tensor parallel rank %d of %d: loads and captures use KV heads %d..%d of %d"
                " (captured heads go to the store as this rank's part%s)",
                tp_rank,
                tp_size,
                heads.start,
                heads.stop - 1,
                heads.total,
                "" if heads.writes else f"; rank {tp_rank - tp_rank % heads.replicas} writes it",
            )

    @property
    def layers(self) -> list[tuple[str, Any]]:
        if self._layers is None:
            layers = attention_layers(self.vllm_config)
            heads = self.heads
            for name, layer in layers:
                if layer.num_kv_heads != heads.count:
                    raise RuntimeError(
                        f"layer {name} holds {layer.num_kv_heads} KV heads, but rank"
                        f" {heads.rank} of tensor parallel size {heads.size} should hold"
                        f" {heads.count} of the model's {heads.total}: the model config and"
                        " vLLM's sharding disagree"
                    )
            self._layers = layers
        return self._layers

    @property
    def writes_with_fused_kernel(self) -> bool:
        """Whether loads so far went through the one-kernel writer."""
        return self._injector is not None

    def start_load_kv(self, meta: InjectionMetadata) -> None:
        injector = self._fused_injector()
        if injector is None:
            self.store.prefetch([piece.key for op in meta.loads for piece in op.pieces])
            for op in meta.loads:
                self._load_backend(op)
                self._count(op, fused=False, in_place=False)
            return
        # Loads whose entries all sit in the GPU pool go first, read where they sit. Only then
        # are the others' entries brought in (async copies): a copy into the pool never
        # overtakes a kernel already issued that reads the region it would reuse.
        rest = []
        for op in meta.loads:
            found = self.store.device_spans([piece.key for piece in op.pieces])
            if found is None:
                rest.append(op)
                continue
            self._load_fused(op, injector, found)
        if rest:
            self.store.prefetch([piece.key for op in rest for piece in op.pieces])
            for op in rest:
                keys = [piece.key for piece in op.pieces]
                self._load_fused(op, injector, self.store.device_spans(keys))

    def save(self, meta: InjectionMetadata) -> None:
        """After the step's forward: copy out the spans it completed (``meta.saves``)."""
        if not meta.saves:
            return
        if not self.heads.writes:
            return  # a replica: the first rank holding these heads writes them
        try:
            if self._reader is None:
                self._reader = CacheReader(
                    self.layers, self.block_size, self._fp8, self._model_dtype
                )
                self._writer = EntryWriter(self.store, self.heads)
            assert self._writer is not None
            capture(self._reader, self._writer, meta.saves, str(self.store.fingerprint))
            self.stats.captured += len(meta.saves)
        except Exception:  # never fail the engine's step: the encoder sees the entry missing
            self.stats.capture_errors += len(meta.saves)
            log.exception("capturing %d spans failed", len(meta.saves))

    def _count(self, op: LoadOp, fused: bool, in_place: bool) -> None:
        stats = self.stats
        stats.loads += 1
        stats.tokens += op.end - op.start
        stats.fused += fused
        stats.in_place += in_place
        log.debug("request %s: injected %d tokens", op.req_id, op.end - op.start)

    def _check_blocks(self, op: LoadOp) -> None:
        if len(op.block_ids) * self.block_size < op.end:
            raise RuntimeError(
                f"{len(op.block_ids)} blocks do not reach position {op.end}; the scheduler"
                " should have refused this request"
            )

    # ---- the one-kernel path (CUDA) ----
    def _fused_injector(self) -> FusedInjector | None:
        """The one-kernel writer for these caches, when ``kv_write`` allows it and it applies
        (CUDA caches of one known layout, one RoPE for all layers, Triton present)."""
        if self.kv_write == "backend":
            return None
        injector = self._injector
        first_cache = _layer_cache(self.layers[0][1])
        if injector is not None and injector.caches[0].data_ptr() == first_cache.data_ptr():
            return injector  # the per-request path: one check, not one per layer
        self._injector = None
        why = self._why_not_fused(first_cache)
        if not why:
            _, first = self.layers[0]
            try:
                self._injector = FusedInjector(  # an fp8 cache seen as its fp8 format
                    [typed(_layer_cache(layer), self._fp8) for _, layer in self.layers],
                    self._layout(),
                    self.block_size,
                    first.num_kv_heads,
                    first.head_size,
                    self.spec.shared_rope,
                )
            except ValueError as exc:
                why = str(exc)
        if why and self.kv_write == "fused":
            raise RuntimeError(f"kv_write='fused' cannot be used: {why}")
        if why:
            log.info("writing injected KV through the backend: %s", why)
            self.kv_write = "backend"  # decided once; "auto" does not retry every step
        return self._injector

    def _why_not_fused(self, first_cache: torch.Tensor) -> str:
        if not self.heads.full:
            return (
                f"tensor parallel rank {self.heads.rank} of {self.heads.size} writes"
                f" {self.heads.count} of each entry's {self.heads.total} KV heads; the one-kernel"
                " writer reads all of them"
            )
        if not fused_inject.available():
            return "Triton is not installed"
        if first_cache.device.type != "cuda":
            return "the KV cache is not on a CUDA device"
        if self.spec.shared_rope is None:
            return "the layers do not share one RoPE"
        try:
            self._layout()
        except UnknownLayoutError as exc:
            return str(exc)
        return ""

    def _layout(self) -> PagedLayout:
        """The one cache layout of every layer, as the kernel addresses it."""
        layouts = set()
        for name, layer in self.layers:
            backend = getattr(getattr(layer, "attn_backend", None), "get_name", lambda: "")()
            if backend not in _FUSED_BACKENDS:
                raise UnknownLayoutError(f"layer {name}: backend {backend!r} is not known")
            cache = _layer_cache(layer)
            layouts.add(detect_layout(cache, self.block_size, layer.num_kv_heads, layer.head_size))
        if len(layouts) != 1:
            raise UnknownLayoutError("the layers' caches differ in layout")
        return layouts.pop()

    def _load_fused(
        self,
        op: LoadOp,
        injector: FusedInjector,
        found: tuple[torch.Tensor, Any, Any] | MixedSpans | None,
    ) -> None:
        """Entries all in the GPU pool (``found``: their
        :meth:`~inferscale_core.kvstore.KVStore.device_spans`) are read in place, described by
        numbers (plain ones, or a request with compressed ones); otherwise each is staged on
        the device and read as a tensor."""
        self._check_blocks(op)
        tokens = op.end - op.start
        if isinstance(found, MixedSpans) and self._mixed_kernel:
            try:
                inject_mixed_in_place(injector, found, op.pieces, op.start, tokens, op.block_ids)
                self._count(op, fused=True, in_place=True)
                return
            except Exception:  # never fail the step: expand with torch from now on
                log.exception("the compressed-entry kernel failed; expanding with torch")
                self._mixed_kernel = False
            found = None
        if isinstance(found, tuple):
            pool, spans, layout = found
            injector.inject_in_place(pool, spans, layout, op.pieces, op.start, tokens, op.block_ids)
        else:
            entries = self.store.get_many([piece.key for piece in op.pieces])
            device = injector.device
            schemes = {e.quant.scheme for e in entries if e.quant is not None}
            if len(schemes) == 1 and self._mixed_kernel:  # codes expanded inside one kernel
                stored = [
                    StoredPiece(_staged(e, device), p.src_start, p.src_end, p.dst_start, p.shift)
                    for p, e in zip(op.pieces, entries, strict=True)
                ]
                try:
                    inject_mixed(injector, stored, op.start, tokens, op.block_ids)
                    self._count(op, fused=True, in_place=False)
                    return
                except Exception:  # never fail the step: expand with torch from now on
                    log.exception("the compressed-entry kernel failed; expanding with torch")
                    self._mixed_kernel = False
            if schemes:  # two schemes in one request (a conversion under way): expanded first
                dtype = injector.caches[0].dtype
                entries = [e if e.quant is None else dequantize(e, dtype, device) for e in entries]
            pieces = [
                SourcePiece(
                    _on(entry.k, device),
                    _on(entry.v, device),
                    piece.src_start,
                    piece.src_end,
                    piece.dst_start,
                    piece.shift,
                )
                for piece, entry in zip(op.pieces, entries, strict=True)
            ]
            injector.inject(pieces, op.start, tokens, op.block_ids)
        self._count(op, fused=True, in_place=found is not None)

    # ---- the backend path (CPU, and any cache the kernel does not know) ----
    def _load_backend(self, op: LoadOp) -> None:
        """Place each piece and re-rotate it, then one backend cache update per layer."""
        layers = self.layers
        first_cache = _layer_cache(layers[0][1])
        # what the backend's update takes: the cache's dtype, or an fp8 cache's model dtype
        device = first_cache.device
        dtype = first_cache.dtype if self._fp8 is None else self._model_dtype
        self._check_blocks(op)
        entries = self.store.get_many([piece.key for piece in op.pieces])
        num_layers, _, stored_heads, head_dim = _shape(entries[0])
        if num_layers != len(layers):
            raise RuntimeError(
                f"stored KV has {num_layers} layers for {len(layers)}; the scheduler should"
                " have refused this request"
            )
        heads = self.heads  # this rank's KV heads of the all-heads entries (all at TP=1)
        if stored_heads != heads.total:
            raise RuntimeError(
                f"stored KV has {stored_heads} KV heads, the model {heads.total}: entries hold"
                " every head of the model that encoded them"
            )
        kv_heads = heads.count
        tokens = op.end - op.start
        k_post = self._scratch("k", (num_layers, tokens, kv_heads, head_dim), dtype, device)
        v_dim = entries[0].v.shape[-1] if entries[0].quant is None else entries[0].quant.v_dim
        v_all = self._scratch("v", (num_layers, tokens, kv_heads, v_dim), dtype)
        # On a CPU with an fp32 cache, vLLM's own RoPE kernel re-rotates in place over our fp32
        # table: 6.2 ms against 19.3 ms for ``rotate`` at k=50 on SmolLM2 (dev CPU, 2 cores),
        # ~7% of that request's TTFT; within an fp32 ulp of ``rotate`` (the AVX-512 build:
        # neox bit-identical).
        in_place = device.type == "cpu" and dtype == torch.float32 and self._rotary() is not None
        shifts = torch.empty(tokens, dtype=torch.int64)  # [tokens] each token's piece's shift
        jobs = []  # (entry, start, end, k_out, v_out): placed on the threads, below
        for piece, entry in zip(op.pieces, entries, strict=True):
            at = piece.dst_start - op.start
            n = piece.src_end - piece.src_start
            if in_place and heads.full and entry.k.device == device:
                # copied, or expanded from its codes, straight into the scratch
                k_out, v_out = k_post[:, at : at + n], v_all[:, at : at + n]
                jobs.append((entry, piece.src_start, piece.src_end, k_out, v_out))
                shifts[at : at + n] = piece.shift
                continue
            if entry.quant is not None:
                entry = dequantize(entry, dtype, device)
            k_rank, v_rank = slice_heads(entry.k, heads), slice_heads(entry.v, heads)  # views
            k_stored = k_rank[:, piece.src_start : piece.src_end].to(device, non_blocking=True)
            if in_place:
                k_post[:, at : at + n] = k_stored
                shifts[at : at + n] = piece.shift
            else:
                for rope, lo, hi in self._rope_runs:  # one run when every layer shares its RoPE
                    shift(k_stored[lo:hi], piece.shift, rope, out=k_post[lo:hi, at : at + n])
            v_all[:, at : at + n] = v_rank[:, piece.src_start : piece.src_end]
        threads = self._threads if device.type == "cpu" else None
        if jobs:
            assert threads is not None  # in_place: a CPU cache
            threads.map(_place, jobs, [job[2] - job[1] for job in jobs])
        rotary = self._rotary() if in_place else None
        rope_of = self.spec.layer_rope  # each layer's RoPE
        slots = torch.as_tensor(op.slots(self.block_size), device=device)  # int64 [tokens]

        def write(index: int) -> None:
            """Layer ``index``: its keys re-rotated in place (the in-place path), then the
            backend's cache update."""
            _, layer = layers[index]
            k, v = k_post[index], v_all[index]  # [tokens, kv_heads, head_dim], contiguous
            if rotary is not None:
                rotary(rope_of[index], shifts, k)
            if self._fp8 is not None:  # stored as the cache holds them: the update divides again
                k_scale, v_scale = scales(layer)
                k = k if k_scale == 1.0 else k * k_scale
                v = v if v_scale == 1.0 else v * v_scale
            layer.impl.do_kv_cache_update(layer, k, v, _layer_cache(layer), slots)

        if threads is None:
            for index in range(len(layers)):
                write(index)
            return
        if rotary is not None:
            for rope in set(rope_of):
                rotary.table(rope)  # made once, before the threads read it
        threads.map(write, range(len(layers)))

    def _rotary(self) -> VllmRotary | None:
        """vLLM's CPU RoPE kernel over our tables, made once; None where the build lacks it."""
        if self._rotary_kernel is None:
            self._rotary_kernel = VllmRotary.load(self.vllm_config.model_config.max_model_len)
        return self._rotary_kernel or None

    def _scratch(
        self,
        name: str,
        shape: tuple[int, int, int, int],
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> torch.Tensor:
        """A reused [layers, tokens, heads, dim] buffer (fresh memory page-faults every time)."""
        layers, tokens, heads, dim = shape
        device = device or _layer_cache(self.layers[0][1]).device
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1] < tokens or buf.dtype != dtype or buf.device != device:
            capacity = max(1024, 1 << (tokens - 1).bit_length())
            buf = torch.empty(layers, capacity, heads, dim, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:, :tokens]  # each layer's [tokens, heads, dim] stays contiguous


class VllmRotary:
    """``rotary(spec, shifts, k)``: keys moved by ``shifts`` positions in place by vLLM's own
    RoPE kernel (``_C.rotary_embedding``, the one the model's forward runs on a CPU), fed a
    table of pure rotations (see :func:`~inferscale_core.rope.shift`) computed from ``spec`` in
    fp32 by :func:`~inferscale_core.rope.cos_sin`, so partial rotary and gptj pairs come out as
    ``shift`` does them (within an fp32 ulp; neox bit-identical in the AVX-512 build).
    ``shifts``: [tokens] int64 in ``(-max_positions, max_positions)``; ``k``: [tokens, kv_heads,
    head_dim], contiguous, fp32."""

    def __init__(self, op: Any, max_positions: int) -> None:
        self._op = op
        self._reach = max_positions  # table row reach + s rotates by s
        self._tables: dict[RopeSpec, torch.Tensor] = {}

    @classmethod
    def load(cls, max_positions: int) -> VllmRotary | bool:
        """The kernel, or False where this vLLM build has none."""
        try:
            # vLLM loads the build of its kernels this CPU runs (_C, _C_AVX512 or _C_AVX2,
            # each registering torch.ops._C); importing vllm._C by name would load a second
            # one (a C++ abort) or one this CPU cannot run (an illegal instruction).
            import vllm._custom_ops  # noqa: F401

            op = torch.ops._C.rotary_embedding
        except (ImportError, AttributeError, RuntimeError):
            return False
        return cls(op, max_positions)

    def __call__(self, spec: RopeSpec, shifts: torch.Tensor, k: torch.Tensor) -> None:
        tokens, heads, dim = k.shape
        rows = shifts + self._reach
        self._op(rows, k.view(tokens, heads * dim), None, dim, self.table(spec), spec.is_neox_style)

    def table(self, spec: RopeSpec) -> torch.Tensor:
        """``[2 * reach, rotary_dim]`` cos then sin of every shift in reach, made once."""
        table = self._tables.get(spec)
        if table is None:
            rows = torch.arange(-self._reach, self._reach)
            cos, sin = cos_sin(pure_rotation(spec), rows)  # [2 * reach, rotary_dim // 2]
            table = self._tables[spec] = torch.cat([cos, sin], dim=-1).contiguous()
        return table


def _place(job: tuple[FactKV, int, int, torch.Tensor, torch.Tensor]) -> None:
    """Tokens ``[start, end)`` of an entry copied, or expanded from its codes, into its slice
    of the scratch (``job``: entry, start, end, k_out, v_out)."""
    dequantize_into(*job)


def _staged(entry: FactKV, device: torch.device) -> FactKV:
    """``entry`` with every tensor (codes and scales) on ``device``, contiguous: those of the
    GPU pool already are (checked cheaply), host copies cross at their compressed size."""
    return with_tensors(entry, {name: _on(t, device) for name, t in entry_tensors(entry).items()})


def _shape(entry: FactKV) -> tuple[int, int, int, int]:
    """``[layers, tokens, kv_heads, head_dim]`` of an entry's keys, compressed or not."""
    layers, tokens, heads, dim = entry.k.shape
    return layers, tokens, heads, dim if entry.quant is None else entry.quant.k_dim


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` and contiguous (entries of the GPU pool already are: checked
    cheaply, as this runs for every fact of every request)."""
    if t.is_cuda and t.get_device() == device.index and t.is_contiguous():
        return t
    return t.to(device, non_blocking=True).contiguous()


def _layer_cache(layer: Any) -> torch.Tensor:
    """The layer's paged KV cache (a tensor in vLLM 0.32; older versions keep a list per engine)."""
    cache = layer.kv_cache
    return cache[0] if isinstance(cache, (list, tuple)) else cache
