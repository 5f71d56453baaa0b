"""Scheduler side of the connector: per request, how many prompt tokens to inject, and which
spans of an encoding request to capture once computed.

It reads only the store's headers (token ids, fingerprint, shape, origin), so it runs wherever
vLLM's scheduler runs. What happened to each request goes back in its finished output's
``kv_transfer_params["inferscale_report"]``: loaded tokens, entries, tiers, captured keys, or
why it refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferscale_core.composer import KV_PARAMS_KEY
from inferscale_core.kvstore import KVStore
from inferscale_core.load_plan import LoadPlan, Refused, plan_load, request_captures
from inferscale_core.request_signing import signature_error
from inferscale_core.vllm_plugin.metadata import InjectionMetadata, LoadOp, SaveOp

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _RequestState:
    plan: LoadPlan | None = None
    refused: str | None = None
    loaded_tokens: int = 0
    computed_before: int = 0
    tiers: dict[str, str] = field(default_factory=dict)  # entry key -> fastest tier holding it
    # Encoding requests: the spans still to capture, the prompt, and the block table so far.
    captures: list[tuple[str, int, int]] = field(default_factory=list)
    captured: list[str] = field(default_factory=list)  # keys handed to the worker
    prompt_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)


class InjectionScheduler:
    """Validates each memory request against the store; plans synchronous loads."""

    def __init__(
        self,
        store: KVStore,
        fingerprint: str,
        block_size: int,
        refusal: str | None = None,
        request_key: bytes | None = None,
    ) -> None:
        self.store = store
        # Set by a server: loads and captures need params it signed (request_signing.py).
        self.request_key = request_key
        self.fingerprint = fingerprint
        self.block_size = block_size
        # Set when this engine cannot serve injected KV exactly (see connector.injection_refusal
        # and model_spec.cache_groups_refusal): every memory request is then refused with it,
        # and prefilled in full.
        self.refusal = refusal
        if refusal is not None:
            log.warning("memory requests will be prefilled, not injected: %s", refusal)
        self._requests: dict[str, _RequestState] = {}
        self._ready: list[LoadOp] = []

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        state = self._requests.setdefault(request.request_id, _RequestState())
        state.plan, state.refused = None, None
        state.computed_before = num_computed_tokens
        unsigned = self._unsigned(request)
        if unsigned is not None:
            state.refused = unsigned
            log.warning("request %s: %s", request.request_id, unsigned)
            return 0, False
        self._note_captures(request, state)
        if self.refusal is not None and KV_PARAMS_KEY in (request.kv_transfer_params or {}):
            state.refused = self.refusal  # said once, when the engine started
            return 0, False
        prompt_logprobs = getattr(request.sampling_params, "prompt_logprobs", None) is not None
        try:
            plan = plan_load(
                request.kv_transfer_params,
                request.prompt_token_ids or [],
                request.num_tokens,
                num_computed_tokens,
                self.store.header_reader(),  # one folder stat for all of the request's entries
                self.fingerprint,
                prompt_logprobs=prompt_logprobs,
            )
        except Refused as exc:
            state.refused = str(exc)
            log.warning("request %s: not injecting: %s", request.request_id, exc)
            return 0, False
        if plan is None:
            if not state.captures:
                self._requests.pop(request.request_id, None)
            return 0, False
        state.plan = plan
        # Where each entry is now, as this process's store sees it (for the memory panel).
        state.tiers = self.store.fastest_tiers(plan.entry_keys)
        return plan.num_tokens, False

    def _unsigned(self, request: Request) -> str | None:
        """Why the request's params may not be used (a key is set and they are not signed
        with it for the request's cache salt), or None."""
        ours = (request.kv_transfer_params or {}).get(KV_PARAMS_KEY)
        if self.request_key is None or ours is None:
            return None
        if not isinstance(ours, dict):
            return "malformed kv_transfer_params"
        return signature_error(ours, self.request_key, getattr(request, "cache_salt", None))

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        state = self._requests.get(request.request_id)
        if state is None or state.plan is None or num_external_tokens == 0:
            return
        plan = state.plan
        if num_external_tokens < plan.num_tokens:  # the scheduler took less than offered
            plan = state.plan = plan.truncated(num_external_tokens)
        reach = -(-plan.end // self.block_size)  # the blocks up to the span's end
        # One KV-cache group (the connector refuses engines with more): its block table.
        block_ids = blocks.get_block_ids()[0][:reach]
        self._ready.append(LoadOp(request.request_id, plan.start, plan.end, plan.pieces, block_ids))
        state.loaded_tokens = plan.num_tokens

    def _note_captures(self, request: Request, state: _RequestState) -> None:
        """Remember what an encoding request asks to capture (once: a request is asked about
        again each time it waits to be scheduled)."""
        if state.captures or state.captured:
            return
        prompt = list(request.prompt_token_ids or [])
        try:
            state.captures = request_captures(
                request.kv_transfer_params, len(prompt), self.fingerprint
            )
        except Refused as exc:
            state.refused = str(exc)
            log.warning("request %s: not capturing: %s", request.request_id, exc)
            return
        if state.captures:
            state.prompt_ids = prompt

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> InjectionMetadata:
        """The step's loads, and the captures whose spans this step's forward completes."""
        meta = InjectionMetadata(loads=self._ready, saves=self._saves(scheduler_output))
        self._ready = []
        return meta

    def _saves(self, out: SchedulerOutput) -> list[SaveOp]:
        """Track encoding requests' block tables through the step's schedule; a span is saved
        in the step whose forward computes its last token (or the first step the request is
        scheduled in, when it was found in the prefix cache)."""
        progress: dict[str, int] = {}  # request -> tokens computed once this step has run
        for new in out.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is not None and state.captures:
                state.block_ids = list(new.block_ids[0])
                progress[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set())
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None or not state.captures:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                if req_id in resumed:  # preempted and back: a new table
                    state.block_ids = list(new_blocks[0])
                else:
                    state.block_ids.extend(new_blocks[0])
            progress[req_id] = cached.num_computed_tokens[i]
        saves = []
        for req_id, computed in progress.items():
            state = self._requests[req_id]
            done = computed + out.num_scheduled_tokens.get(req_id, 0)
            for key, start, end in [c for c in state.captures if c[2] <= done]:
                reach = -(-end // self.block_size)
                ids = state.prompt_ids[start:end]
                saves.append(SaveOp(req_id, key, start, end, ids, state.block_ids[:reach]))
                state.captures.remove((key, start, end))
                state.captured.append(key)
        return saves

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return False, None
        report = {
            "loaded_tokens": state.loaded_tokens,
            "computed_before": state.computed_before,
            "span_end": state.plan.end if state.plan else None,
            "entries": state.plan.entry_keys if state.plan else [],
            "refused": state.refused,
            "tiers": state.tiers,
            "captured": state.captured,  # handed to the worker, written to the store after
        }
        return False, {"inferscale_report": report}
