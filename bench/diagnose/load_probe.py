"""Where the connector's load spends its time on a GPU host, part by part, outside vLLM.

``python -m bench.diagnose.load_probe OUT_DIR`` (``PROBE=1`` in ``gpu_run.sh``) builds 51
entries of the Llama-3.1-8B shape (one 32-token prefix and 50 facts of 55 tokens, bf16), and
writes ``OUT_DIR/load_probe.json`` with:

* ``issue_us``: the CPU time of the parts of a k=50 load from the GPU pool, through their
  public calls, in a hot loop (median of 300): the pool lookup (``KVStore.device_spans``), the
  per-piece array (``in_place_info``), the whole ``FusedInjector.inject_in_place`` with the
  compiled kernel's own launcher (what the injector does after its first load), and the same
  on an injector kept on Triton's launch path (``direct_launch=False``), for the difference;
* ``host_tier_ms``: the same entries from pinned host RAM into the pool: CPU time and time to
  done of ``KVStore.prefetch``, of the same bytes as bare per-tensor copies, and of one copy of
  all bytes (the floor), median of 7.

Needs CUDA: the point is the GPU host's own speed.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from inferscale_core.kvstore import KVStore
from inferscale_core.load_plan import Piece
from inferscale_core.rope import RopeSpec
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin.fused_inject import FusedInjector, in_place_info
from inferscale_core.vllm_plugin.paged_layouts import PagedLayout

LAYERS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 64  # the 8B shape; the product's GPU block
PREFIX_TOKENS, FACT_TOKENS, FACTS = 32, 55, 50


def _cuda_time(work: Callable[[], Any], runs: int) -> tuple[float, float]:
    """Median (CPU time, time until the GPU is done) of ``work``, in ms, from an idle GPU."""
    cpu, done = [], []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        work()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        cpu.append(t1 - t0)
        done.append(time.perf_counter() - t0)
    return statistics.median(cpu) * 1e3, statistics.median(done) * 1e3


def _store(root: str) -> tuple[KVStore, list[Piece]]:
    store = KVStore(root, host_bytes=8 << 30, gpu_bytes=1 << 30, fingerprint="probe")
    pieces, at = [], 0
    for i in range(FACTS + 1):
        n = PREFIX_TOKENS if i == 0 else FACT_TOKENS
        k = torch.randn(LAYERS, n, KV_HEADS, HEAD_DIM).to(torch.bfloat16)  # [layers, tokens, h, d]
        store.put(FactKV(f"e{i}", list(range(n)), k, k.clone(), "probe"))
        pieces.append(Piece(f"e{i}", 0, n, at))
        at += n
    return store, pieces


def issue_parts(store: KVStore, pieces: list[Piece], runs: int = 300) -> dict[str, float]:
    keys = [p.key for p in pieces]
    store.prefetch(keys)
    tokens = pieces[-1].dst_start + pieces[-1].src_end
    blocks = tokens // BLOCK_SIZE + 1
    block_ids = list(range(blocks))
    caches = [  # FA3's layout on the H200: [blocks, heads, block_size, 2 * dim], NHD in memory
        torch.empty(
            blocks, BLOCK_SIZE, KV_HEADS, 2 * HEAD_DIM, dtype=torch.bfloat16, device="cuda"
        ).permute(0, 2, 1, 3)
        for _ in range(LAYERS)
    ]
    inv_freq = 1.0 / (500000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    rope = RopeSpec(HEAD_DIM, HEAD_DIM, tuple(inv_freq.tolist()), 1.0, True, "default")
    shape = (PagedLayout.FUSED_HEADS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, rope)
    injector = FusedInjector(caches, *shape)
    triton_path = FusedInjector(caches, *shape, direct_launch=False)
    found = store.device_spans(keys)
    assert found is not None, "the probe's entries should all be in the GPU pool"
    pool, spans, layout = found

    def in_place(injector: FusedInjector = injector) -> None:
        injector.inject_in_place(pool, spans, layout, pieces, 0, tokens, block_ids)

    in_place()  # compiles, and arms the direct launch
    in_place(triton_path)
    parts = {
        "pool_lookup": lambda: store.device_spans(keys),
        "inject_in_place": in_place,
        "per_piece_array": lambda: in_place_info(pieces, spans, layout[0]),
        "inject_in_place_triton_launch": lambda: in_place(triton_path),
    }
    return {name: _cuda_time(work, runs)[0] * 1e3 for name, work in parts.items()}


def host_tier(store: KVStore, keys: list[str], runs: int = 7) -> dict[str, Any]:
    nbytes = sum(store.header(key).nbytes for key in keys)
    out: dict[str, Any] = {"bytes": nbytes}

    def timed(work: Callable[[], Any]) -> tuple[float, float]:
        samples = []
        for _ in range(runs):
            store.demote(keys, "host", pin=True)
            samples.append(_cuda_time(work, 1))
        return tuple(statistics.median(x[i] for x in samples) for i in (0, 1))  # type: ignore[return-value]

    out["entries_pinned"] = store.host_tier.get(keys[-1]).k.is_pinned()
    out["prefetch_cpu_done_ms"] = timed(lambda: store.prefetch(keys))
    hosted = [store.host_tier.get(key) for key in keys]
    flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def copies() -> None:
        at = 0
        for entry in hosted:
            for t in (entry.k, entry.v):
                size = t.numel() * t.element_size()
                flat[at : at + size].view(t.dtype).view(t.shape).copy_(t, non_blocking=True)
                at += size

    out["bare_copies_cpu_done_ms"] = timed(copies)
    big = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    out["one_copy_cpu_done_ms"] = timed(lambda: flat.copy_(big, non_blocking=True))
    out["one_copy_gb_per_s"] = nbytes / (out["one_copy_cpu_done_ms"][1] / 1e3) / 1e9
    return out


def main(out_dir: Path) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise SystemExit("load_probe needs a CUDA GPU: it measures the GPU host's own speed")
    with tempfile.TemporaryDirectory() as root:
        store, pieces = _store(root)
        result = {
            "device": torch.cuda.get_device_name(),
            "k": FACTS,
            "issue_us": issue_parts(store, pieces),
            "host_tier_ms": host_tier(store, [p.key for p in pieces]),
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "load_probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1]))
