"""Worker side of the connector: re-rotate stored pre-RoPE keys and write them into the cache.

How the cache is written (``kv_write``):

* ``"fused"`` (GPU): one Triton kernel re-rotates the keys of every layer and writes K and V
  straight from the stored entries into the paged cache (:mod:`.fused_inject`), for the layouts
  ``paged_layouts`` knows (vLLM 0.26 FLASH_ATTN / FLASHINFER / TRITON_ATTN).
* ``"backend"``: the attention backend's own cache-update function
  (``layer.impl.do_kv_cache_update``), the call the forward pass makes, so every layout (the CPU
  backend's ISA-packed keys included) is written as the backend expects it; one call per layer.
* ``"torch"`` (GPU): plain torch indexing per layer over the layouts of ``paged_layouts``.
* ``"auto"`` (default): ``"fused"`` where it applies, else ``"backend"``.

The load is synchronous, before the forward, and never touches
``forward_context.attn_metadata`` (None under full CUDA graphs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from inferscale_core.kvstore import KVStore
from inferscale_core.rope import RopeSpec, cos_sin, rotate, rotate_fused
from inferscale_core.vllm_plugin import fused_inject
from inferscale_core.vllm_plugin.fused_inject import FusedInjector, SourcePiece
from inferscale_core.vllm_plugin.metadata import InjectionMetadata, LoadOp
from inferscale_core.vllm_plugin.paged_layouts import (
    PagedLayout,
    UnknownLayoutError,
    detect_layout,
    scatter_kv,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

# GPU attention backends whose paged cache layouts paged_layouts.py knows (vLLM 0.26).
_TORCH_WRITABLE_BACKENDS = frozenset({"FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"})

KV_WRITE_MODES = ("auto", "fused", "backend", "torch")

# Model types whose RoPE rotates interleaved pairs (GPT-J style) instead of halves (NeoX style).
_GPTJ_STYLE_MODEL_TYPES = frozenset({"gptj", "chatglm", "glm"})


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
    """Executes the step's :class:`LoadOp` list before the forward."""

    def __init__(self, vllm_config: VllmConfig, store: KVStore, kv_write: str = "auto") -> None:
        if kv_write not in KV_WRITE_MODES:
            modes = ", ".join(KV_WRITE_MODES)
            raise ValueError(f"kv_write must be one of {modes}, got {kv_write!r}")
        self.kv_write = kv_write
        self.vllm_config = vllm_config
        self.store = store
        hf_config = vllm_config.model_config.hf_text_config
        self.rope = RopeSpec.from_hf_config(
            hf_config, is_neox_style=hf_config.model_type not in _GPTJ_STYLE_MODEL_TYPES
        )
        self.block_size = vllm_config.cache_config.block_size
        self._layers: list[tuple[str, Any]] | None = None
        self._layouts: dict[str, PagedLayout] | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._injector: FusedInjector | None = None
        self._rotary: Callable[[torch.Tensor, torch.Tensor], None] | bool | None = None
        self.sync_timing = False  # benchmarks set it to time GPU work exactly (adds syncs)
        self.fused_rope = True  # on CUDA: one torch.compile'd kernel for the re-rotation
        self.last_load_ms: float = 0.0
        self.loads = 0  # loads done so far (a bench reads ``last_load`` when this moved on)
        self.last_load: dict[str, float] = {}  # timing of the last load, see ``_load``

    @property
    def layers(self) -> list[tuple[str, Any]]:
        if self._layers is None:
            self._layers = attention_layers(self.vllm_config)
        return self._layers

    @property
    def _torch_layouts(self) -> dict[str, PagedLayout]:
        """GPU layers whose cache layout we write with torch indexing (see paged_layouts)."""
        if self._layouts is None:
            self._layouts = {}
            for name, layer in self.layers:
                cache = _layer_cache(layer)
                backend = getattr(getattr(layer, "attn_backend", None), "get_name", lambda: "")()
                if cache.device.type != "cuda" or backend not in _TORCH_WRITABLE_BACKENDS:
                    continue
                try:
                    self._layouts[name] = detect_layout(
                        cache, self.block_size, layer.num_kv_heads, layer.head_size
                    )
                except UnknownLayoutError as exc:
                    log.info("layer %s: using the backend's cache update: %s", name, exc)
        return self._layouts

    @property
    def writes_with_fused_kernel(self) -> bool:
        """Whether loads so far went through the one-kernel writer."""
        return self._injector is not None

    def fused_injector(self) -> FusedInjector | None:
        """The one-kernel writer for these caches, when ``kv_write`` allows it and it applies
        (CUDA caches of one known layout, Triton present); None otherwise."""
        if self.kv_write not in ("auto", "fused"):
            return None
        injector = self._injector
        first_cache = _layer_cache(self.layers[0][1])
        if injector is not None and injector.caches[0].data_ptr() == first_cache.data_ptr():
            return injector  # the per-request path: one check, not one per layer
        caches = [_layer_cache(layer) for _, layer in self.layers]
        self._injector = None
        layouts = self._torch_layouts
        why = ""
        if not fused_inject.available():
            why = "Triton is not installed"
        elif caches[0].device.type != "cuda":
            why = "the KV cache is not on a CUDA device"
        elif len(layouts) != len(self.layers) or len(set(layouts.values())) != 1:
            why = "not every layer's cache has one layout the kernel knows"
        if not why:
            _, first = self.layers[0]
            try:
                self._injector = FusedInjector(
                    caches,
                    next(iter(layouts.values())),
                    self.block_size,
                    first.num_kv_heads,
                    first.head_size,
                    self.rope,
                )
            except ValueError as exc:
                why = str(exc)
        if why and self.kv_write == "fused":
            raise RuntimeError(f"kv_write='fused' cannot be used: {why}")
        if why:
            log.info("writing injected KV through the backend: %s", why)
            self.kv_write = "backend"  # decided once; "auto" does not retry every step
        return self._injector

    def start_load_kv(self, meta: InjectionMetadata) -> None:
        # Loads whose entries all sit in the GPU pool go first, read where they sit (one pass
        # over their keys). Only then are the others' entries brought to the fastest tier
        # (async on a GPU): a copy in never overtakes a kernel already issued.
        injector = self._cuda_injector()
        rest = []
        for op in meta.loads:
            t0 = time.perf_counter()
            found = None
            if injector is not None:
                found = self.store.device_spans([piece.key for piece in op.pieces])
            if found is None:
                rest.append(op)
                continue
            self._check_blocks(op)
            self.last_load = self._load_fused(op, injector, found, t0)
            self.last_load["resident"] = 1.0  # found in the GPU pool before any prefetch
            self._finish_load(op, t0, prefetch_ms=0.0)
        if not rest:
            return
        t0 = time.perf_counter()
        self.store.prefetch([piece.key for op in rest for piece in op.pieces])
        prefetch_ms = (time.perf_counter() - t0) * 1e3
        for op in rest:
            t0 = time.perf_counter()
            self.last_load = self._load(op)
            self._finish_load(op, t0, prefetch_ms)

    def _finish_load(self, op: LoadOp, t0: float, prefetch_ms: float) -> None:
        self.last_load_ms = (time.perf_counter() - t0) * 1e3
        self.last_load.update(total_ms=self.last_load_ms, prefetch_ms=prefetch_ms)
        self.loads += 1
        log.debug(
            "request %s: injected %d tokens in %.2f ms",
            op.req_id,
            op.end - op.start,
            self.last_load_ms,
        )

    def _check_blocks(self, op: LoadOp) -> None:
        if len(op.block_ids) * self.block_size < op.end:
            raise RuntimeError(
                f"{len(op.block_ids)} blocks do not reach position {op.end}; the scheduler"
                " should have refused this request"
            )

    def _cuda_injector(self) -> FusedInjector | None:
        """The fused writer when the cache is on a CUDA device and it applies."""
        if not _layer_cache(self.layers[0][1]).is_cuda:
            return None
        return self.fused_injector()

    def _scratch(
        self, name: str, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A reused [layers, tokens, heads, dim] buffer (fresh memory page-faults every time)."""
        layers, tokens, heads, dim = shape
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1] < tokens or buf.dtype != dtype or buf.device != device:
            capacity = max(1024, 1 << (tokens - 1).bit_length())
            buf = torch.empty(layers, capacity, heads, dim, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:, :tokens]  # each layer's [tokens, heads, dim] stays contiguous

    def _cpu_rotary(
        self, dtype: torch.dtype
    ) -> Callable[[torch.Tensor, torch.Tensor], None] | None:
        """The in-place kernel rotation when the cache is fp32 and vLLM has the kernel."""
        if dtype != torch.float32:
            return None
        if self._rotary is None:
            max_positions = self.vllm_config.model_config.max_model_len
            self._rotary = vllm_rotary(self.rope, max_positions) or False
        return self._rotary or None

    def _rotate_on_gpu(
        self, k_pre: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, out: torch.Tensor
    ) -> torch.Tensor:
        if self.fused_rope:
            try:
                return rotate_fused(k_pre, positions, self.rope, dtype)
            except Exception as exc:  # a compiler problem must not break serving
                log.warning("fused RoPE unavailable (%s); using the unfused rotation", exc)
                self.fused_rope = False
        return rotate(k_pre, positions, self.rope, out=out)

    def _load(self, op: LoadOp) -> dict[str, float]:
        """Load one request's span; returns its timing: ``get_ms`` (store reads: with the
        step's ``prefetch_ms``, the tier's cost), ``rotate_ms`` (re-rotation and V gather),
        ``write_ms`` (cache writes)."""
        layers = self.layers
        first_cache = _layer_cache(layers[0][1])
        device, dtype = first_cache.device, first_cache.dtype
        self._check_blocks(op)
        injector = self._cuda_injector()
        if injector is not None:
            return self._load_fused(op, injector, None, time.perf_counter())
        t0 = time.perf_counter()
        entries = self.store.get_many([piece.key for piece in op.pieces])
        t1 = time.perf_counter()
        num_layers, _, kv_heads, head_dim = entries[0].k.shape
        head_dim_v = entries[0].v.shape[-1]
        tokens = op.end - op.start
        if num_layers != len(layers):
            raise RuntimeError(
                f"stored KV has {num_layers} layers for {len(layers)}; the scheduler should"
                " have refused this request"
            )
        positions = torch.arange(op.start, op.end, dtype=torch.int64, device=device)  # [tokens]
        k_post = self._scratch("k", (num_layers, tokens, kv_heads, head_dim), dtype, device)
        v_all = self._scratch("v", (num_layers, tokens, kv_heads, head_dim_v), dtype, device)
        if device.type == "cuda":
            # Few big kernels: gather all pieces, then one rotation over the whole span.
            parts = list(zip(op.pieces, entries, strict=True))
            k_pre = torch.cat([e.k[:, p.src_start : p.src_end] for p, e in parts], dim=1)
            v_all = torch.cat([e.v[:, p.src_start : p.src_end] for p, e in parts], dim=1)
            k_pre, v_all = k_pre.to(device, non_blocking=True), v_all.to(device, dtype)
            k_post = self._rotate_on_gpu(k_pre, positions, dtype, k_post)
        else:
            # CPU: copy each piece into place, then re-rotate layer by layer in place with
            # vLLM's RoPE kernel over our fp32 table (neox: bit-identical to ``rotate``; ~3x
            # faster than torch's elementwise ops). Without the kernel (or with a non-fp32
            # cache), rotate each piece straight into place.
            rotary = self._cpu_rotary(dtype)
            for piece, entry in zip(op.pieces, entries, strict=True):
                at = piece.dst_start - op.start
                n = piece.src_end - piece.src_start
                k_pre = entry.k[:, piece.src_start : piece.src_end]
                if rotary is None:
                    rotate(k_pre, positions[at : at + n], self.rope, out=k_post[:, at : at + n])
                else:
                    k_post[:, at : at + n] = k_pre
                v_all[:, at : at + n] = entry.v[:, piece.src_start : piece.src_end]
            if rotary is not None:
                for layer_k in k_post:  # [tokens, kv_heads, head_dim], contiguous
                    rotary(positions, layer_k)
        slots = torch.as_tensor(op.slots(self.block_size), device=device)  # int64 [tokens]
        if self.sync_timing and device.type == "cuda":
            torch.cuda.synchronize(device)  # benchmarks only: time the kernels, not launches
        t2 = time.perf_counter()
        for index, (name, layer) in enumerate(layers):
            cache = _layer_cache(layer)
            layout = self._torch_layouts.get(name) if self.kv_write == "torch" else None
            if layout is not None:
                scatter_kv(cache, layout, k_post[index], v_all[index], slots, self.block_size)
            else:  # the backend's own write: right for every layout, incl. ISA-packed CPU keys
                layer.impl.do_kv_cache_update(layer, k_post[index], v_all[index], cache, slots)
        if self.sync_timing and device.type == "cuda":
            torch.cuda.synchronize(device)
        t3 = time.perf_counter()
        return {
            "tokens": float(tokens),
            "get_ms": (t1 - t0) * 1e3,
            "rotate_ms": (t2 - t1) * 1e3,
            "write_ms": (t3 - t2) * 1e3,
        }

    def _load_fused(
        self,
        op: LoadOp,
        injector: FusedInjector,
        found: tuple[torch.Tensor, Any, Any] | None,
        t0: float,
    ) -> dict[str, float]:
        """The one-kernel load. Entries all in the GPU pool (``found``: their
        :meth:`~inferscale_core.kvstore.KVStore.device_spans`, looked up since ``t0``) are read
        in place, described by numbers (``in_place``: 1); otherwise each is staged on the
        device and read as a tensor."""
        tokens = op.end - op.start
        entries = None
        if found is None:
            keys = [piece.key for piece in op.pieces]
            found = self.store.device_spans(keys)
            entries = None if found is not None else self.store.get_many(keys)
        device = injector.device
        t1 = time.perf_counter()
        pieces = None
        if entries is not None:
            pieces = [
                SourcePiece(
                    _on(entry.k, device),
                    _on(entry.v, device),
                    piece.src_start,
                    piece.src_end,
                    piece.dst_start,
                )
                for piece, entry in zip(op.pieces, entries, strict=True)
            ]
        if self.sync_timing:
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        if pieces is not None:
            injector.inject(pieces, op.start, tokens, op.block_ids)
        else:
            pool, spans, layout = found
            injector.inject_in_place(pool, spans, layout, op.pieces, op.start, tokens, op.block_ids)
        if self.sync_timing:
            torch.cuda.synchronize(device)
        t3 = time.perf_counter()
        return {
            **injector.timing,  # the kernel call's parts (us)
            "tokens": float(tokens),
            "in_place": float(found is not None),
            "get_ms": (t1 - t0) * 1e3,
            "rotate_ms": (t2 - t1) * 1e3,  # staging of off-device entries only
            "write_ms": (t3 - t2) * 1e3,  # the one kernel: re-rotation and all writes
        }


def vllm_rotary(
    spec: RopeSpec, max_positions: int
) -> Callable[[torch.Tensor, torch.Tensor], None] | None:
    """``rotate_(positions, k)``: keys rotated in place by vLLM's own RoPE kernel
    (``_C.rotary_embedding``, the one the model's forward runs on CPU), fed a cos/sin table
    computed from ``spec`` in fp32 by :func:`~inferscale_core.rope.cos_sin` — so yarn's
    scaling, partial rotary and gptj pairs come out as :func:`rotate` does them (neox:
    bit-identical; gptj: within an fp32 ulp).
    ``positions``: [tokens] int64; ``k``: [tokens, kv_heads, head_dim], contiguous, fp32.
    None where this vLLM build has no such kernel.
    """
    try:
        import vllm._C  # noqa: F401 - registers torch.ops._C

        op = torch.ops._C.rotary_embedding
    except (ImportError, AttributeError, RuntimeError):
        return None
    cos, sin = cos_sin(spec, torch.arange(max_positions))  # [max_positions, rotary_dim // 2]
    table = torch.cat([cos, sin], dim=-1).contiguous()  # [max_positions, rotary_dim] fp32

    def rotate_(positions: torch.Tensor, k: torch.Tensor) -> None:
        tokens, heads, dim = k.shape
        op(positions, k.view(tokens, heads * dim), None, dim, table, spec.is_neox_style)

    return rotate_


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
