"""``InferScaleConnector``: the KVConnectorBase_V1 subclass vLLM loads by module path.

Load it with::

    KVTransferConfig(
        kv_connector="InferScaleConnector",
        kv_connector_module_path="inferscale_core.vllm_plugin.connector",
        kv_role="kv_both",
        kv_connector_extra_config={"store_path": "...", "fingerprint": "..."},
    )

and steer it per request with ``SamplingParams(extra_args={"kv_transfer_params": ...})`` as
built by :meth:`inferscale_core.composer.ComposedPrompt.kv_transfer_params`. Each role builds
its own half (scheduler or worker) and every method delegates to it, like vLLM's offloading
connector. What happened to a request comes back in ``RequestOutput.kv_transfer_params``
under ``"inferscale_report"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.config import CUDAGraphMode
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from inferscale_core.kvstore import KVStore
from inferscale_core.model_spec import ModelSpec, UnsupportedModelError, cache_groups_refusal
from inferscale_core.vllm_plugin.lifetime import die_with_parent
from inferscale_core.vllm_plugin.metadata import InjectionMetadata
from inferscale_core.vllm_plugin.scheduler_side import InjectionScheduler
from inferscale_core.vllm_plugin.worker_side import InjectionWorker, tensor_parallel

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class InferScaleConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        missing = {"store_path", "fingerprint"} - set(extra)
        if missing:
            raise ValueError(
                f"InferScaleConnector needs kv_connector_extra_config {sorted(missing)}"
            )
        fingerprint = str(extra["fingerprint"])
        # Its own store from plain settings, whatever process vLLM runs it in; an app in the
        # same process hands it its own instead (``use_store``), to share the memory tiers.
        # The scheduler side reads headers only: it checks a new entry's file whole (the
        # store does, at first sight) but keeps no tensors, which only the worker side loads.
        host_bytes = int(extra.get("host_bytes", 1 << 30))
        store = KVStore(
            extra["store_path"],
            host_bytes=0 if role == KVConnectorRole.SCHEDULER else host_bytes,
            gpu_bytes=int(extra.get("gpu_bytes", 0)),  # device pool; absent without CUDA
            fingerprint=fingerprint,
            store_dtype=str(extra.get("store_dtype", "model")),
        )
        spec, refusal = None, None
        try:
            spec = ModelSpec.from_hf_config(vllm_config.model_config.hf_text_config)
        except UnsupportedModelError as exc:
            refusal = str(exc)
        self._scheduler: InjectionScheduler | None = None
        self._worker: InjectionWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            if "parent_pid" in extra:  # vLLM's engine core, started by our server
                die_with_parent(int(extra["parent_pid"]))
            mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
            refusal = (
                refusal
                or cache_groups_refusal(len(kv_cache_config.kv_cache_groups))
                or injection_refusal(
                    mode.name if mode is not None else None,
                    bool(getattr(vllm_config, "use_v2_model_runner", False)),
                )
            )
            block_size = vllm_config.cache_config.block_size
            key = extra.get("request_key")
            self._scheduler = InjectionScheduler(
                store,
                fingerprint,
                block_size,
                refusal=refusal,
                request_key=bytes.fromhex(key) if key else None,
            )
        elif spec is not None:  # an unsupported model gets no loads: the scheduler refuses
            tp_rank, tp_size = tensor_parallel(vllm_config)  # one worker side per rank
            kv_write = extra.get("kv_write", "auto")
            self._worker = InjectionWorker(vllm_config, store, spec, kv_write, tp_rank, tp_size)

    def use_store(self, store: KVStore) -> None:
        """Serve from ``store`` (an app's own, in this process) instead of the one opened from
        the settings; it must be the same folder and model."""
        side = self._scheduler or self._worker
        if side is None:
            return
        if store.root.resolve() != side.store.root.resolve():
            raise ValueError(f"store {store.root} is not the connector's {side.store.root}")
        if store.fingerprint != side.store.fingerprint:
            raise ValueError(
                f"store for model {store.fingerprint!r}, not {side.store.fingerprint!r}"
            )
        side.store = store

    # ---- worker side ----
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        return  # we write through each layer's backend, which owns its cache tensor

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self._worker is None:
            return  # an unsupported model: the scheduler refused every load
        meta = self._get_connector_metadata()
        assert isinstance(meta, InjectionMetadata)
        if meta.loads:
            self._worker.start_load_kv(meta)

    @property
    def worker(self) -> InjectionWorker | None:
        """The worker side (None in the scheduler's role)."""
        return self._worker

    @property
    def scheduler(self) -> InjectionScheduler | None:
        """The scheduler side (None in a worker's role)."""
        return self._scheduler

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous and complete before the forward

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # captures are copied after the whole forward, in wait_for_save

    def wait_for_save(self) -> None:
        """After the step's forward (also one replayed from a CUDA graph): copy out the spans
        of encoding requests it completed."""
        if self._worker is None:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, InjectionMetadata)
        if meta.saves:
            self._worker.save(meta)

    # ---- scheduler side ----
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)


def injection_refusal(cudagraph_mode: str | None, v2_model_runner: bool) -> str | None:
    """Why an engine with this ``cudagraph_mode`` (a ``CUDAGraphMode`` name) and model runner
    cannot serve injected KV exactly, or None.

    Measured on the H200 with vLLM 0.26 (docs/BENCHMARKS.md): with full CUDA graphs for
    prefills (a mode whose mixed-batch mode is FULL), the V2 model runner's forward over
    injected KV differs from a full prefill (max |Δ logprob| 0.51 at k=1, with or without a
    device sync around the load), while the V1 runner's stays exact (0.0158, bf16 noise).
    vLLM's default mode runs prefills piecewise and is exact with both runners.
    """
    if not v2_model_runner or cudagraph_mode is None:
        return None
    if CUDAGraphMode[cudagraph_mode].mixed_mode() != CUDAGraphMode.FULL:
        return None
    return (
        "vLLM's V2 model runner with full CUDA graphs for prefills (cudagraph_mode"
        f" {cudagraph_mode}) does not read injected KV exactly; use vLLM's default cudagraph"
        " mode, or VLLM_USE_V2_MODEL_RUNNER=0"
    )
