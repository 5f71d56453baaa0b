"""``bench app``: the whole assistant in one process, on one copy of the model.

The session, its background memory worker, retrieval and injection, as the chat runs them
(``wiring.build`` + ``wiring.open_session``), measured from outside through their public calls:

* **encoding**: ``--facts`` statements told in one conversation (as an import adds them), then
  extracted, embedded and encoded in the background, through the engine: facts per second;
* **chat, idle**: TTFT of ``--questions`` turns answered with their memories injected;
* **turn logged → fact injectable**: ``--probes`` single statements, each timed from the turn
  being logged until the fact extracted from it has its KV entry recorded (it is then
  injected, not pasted as text, into the next reply);
* **chat while encoding**: a backlog of ``--backlog`` statements is logged in a second profile
  (another user of the same engine, whose memory worker nothing pauses), and the same
  questions are answered while it encodes: TTFT against the idle turns of the same run. What
  keeps the chat first is the engine alone: priority scheduling puts the turn before waiting
  encoding requests, encoding requests still in their prefill step aside until the turn has
  its first token (``vllm_plugin/driver.py``), and a step computes at most
  ``max_num_batched_tokens`` prompt tokens, so the turn waits for the step in flight at most.
  (A user's own backlog is gentler: the worker stops for their turns, and retrieved facts not
  yet encoded go in as text.)
* **GPU memory** (CUDA): the process's peak, and with ``--old-design`` what a second (Hugging
  Face) copy of the weights, as the previous design loaded for encoding, adds to it.

On a GPU it runs on dummy weights of a model shape (``--dummy-config``) with a SmolLM2
tokenizer (``--tokenizer``) and a hashing embedder (the GPU image has no MiniLM); on the CPU on
the real embedded model and MiniLM. ``python -m bench.app_path OUT …`` writes
``OUT/app_path.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.report import percentile, provenance, write_json

_PEOPLE = ["Ana", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun"]


def word_bank(tokenizer: Any, size: int = 4000) -> list[str]:
    """Lower-case words of 6+ letters from the tokenizer's vocabulary (whole-word tokens)."""
    words = sorted(
        {
            token.lstrip("Ġ▁")
            for token in tokenizer.get_vocab()
            if token[:1] in ("Ġ", "▁") and token[1:].isalpha() and token[1:].islower()
        }
    )
    return [w for w in words if len(w) >= 6][:size]


def statements(n: int, seed: int, words: Sequence[str]) -> list[str]:
    """``n`` distinct first-person statements, one fact each (the deterministic extractor's),
    each on words of its own, so that extraction merges none as a near-duplicate."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b, c, d = rng.sample(list(words), 4)
        out.append(
            f"My friend {rng.choice(_PEOPLE)} says the {a} and the {b} belong in the {c}"
            f" near the {d}, since day {i}."
        )
    return out


QUESTIONS = [
    "When did I adopt the parrot?",
    "What did my sister buy in Lisbon?",
    "Which race did Chen run?",
    "What did I paint in Osaka?",
    "How much did the telescope cost?",
]


class HashEmbedder:
    """Texts → unit vectors by hashing their words into 384 dims: retrieval without a model
    (the GPU image has no MiniLM); a stand-in for the product's embedder, not its quality."""

    dim = 384
    name = "hash-words-384"

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), self.dim)  # [n, dim]
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
                out[row, h % self.dim] += 1.0
        return out / out.norm(dim=1, keepdim=True).clamp_min(1e-9)


def run_app(
    session: Any,
    backlog_session: Any,
    *,
    facts: int = 200,
    backlog: int = 2000,
    probes: int = 20,
    questions: int = 20,
    think_s: float = 1.0,
    seed: int = 0,
    timeout_s: float = 3600.0,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure one session (see the module's docstring); the JSON-ready rows."""
    from inferscale_core.types import Conversation, Turn

    worker, log, profile = session.worker, session.factlog, session.profile_id
    words = word_bank(session.builder.layout.tokenizer)
    lines = statements(facts + probes + backlog, seed, words)
    told, probe_lines, backlog_lines = (
        lines[:facts],
        lines[facts : facts + probes],
        lines[facts + probes :],
    )
    now = datetime.now(UTC)
    out: dict[str, Any] = {}

    on_progress(f"telling {facts} facts and encoding them")
    t0 = time.perf_counter()
    log.add_conversation(profile, Conversation("told", [Turn("user", s, now) for s in told]))
    worker.wake()
    if not worker.wait_idle(timeout=timeout_s):
        raise RuntimeError(f"encoding {facts} facts took over {timeout_s:.0f} s")
    seconds = time.perf_counter() - t0
    stats = worker.stats
    if stats.errors:
        raise RuntimeError(f"the memory worker failed: {stats.last_error}")
    out["encode"] = {
        "facts_told": facts,
        "facts_encoded": stats.encoded_facts,
        "seconds": seconds,
        "facts_per_s": stats.encoded_facts / seconds,
        "note": "extraction, embedding and encoding through the engine, in the background",
    }

    chat = session.new_conversation("questions")
    asked = [QUESTIONS[i % len(QUESTIONS)] for i in range(questions)]

    def ask_all() -> list[dict[str, Any]]:
        rows = []
        for question in asked:
            time.sleep(think_s)  # a person reading and typing: the worker encodes meanwhile
            reply = session.ask_all(chat, question)
            result = reply.result
            rows.append(
                {
                    "ttft_s": result.ttft_s,
                    "injected_facts": len(reply.injected_fact_ids),
                    "text_facts": sum(f.how.startswith("text") for f in reply.facts),
                    "prompt_tokens": result.prompt_tokens,
                    "injected_tokens": result.injected_tokens,
                }
            )
        return rows

    on_progress(f"{questions} questions, idle")
    ask_all()  # warm: the first replies of a session pay one-time costs
    idle = ask_all()
    out["chat_idle"] = _ttft_summary(idle)

    on_progress(f"{probes} statements, each until its fact is injectable")
    probe_conv = session.new_conversation("probes")
    latencies = []
    for text in probe_lines:
        t0 = time.perf_counter()
        turn_id = log.append_turn(probe_conv, Turn("user", text, datetime.now(UTC)))
        worker.wake()
        latencies.append(_until_injectable(session, turn_id, t0, timeout_s=120.0))
    out["turn_to_injectable"] = {
        "probes": probes,
        "p50_s": statistics.median(latencies),
        "p90_s": percentile(latencies, 0.9),
        "samples_s": latencies,
    }

    on_progress(f"{questions} questions while another user's backlog of {backlog} encodes")
    other = backlog_session
    other.factlog.add_conversation(
        other.profile_id, Conversation("backlog", [Turn("user", s, now) for s in backlog_lines])
    )
    other.worker.wake()
    time.sleep(think_s)  # its first wave is in the engine
    preempted = getattr(session.engine, "background_preempted", 0)
    busy = ask_all()
    preempted = getattr(session.engine, "background_preempted", 0) - preempted
    encoded_meanwhile = other.worker.stats.encoded_facts
    other.worker.stop()
    out["chat_while_encoding"] = {
        **_ttft_summary(busy),
        "backlog": backlog,
        "encoded_meanwhile": encoded_meanwhile,  # by the other user's worker, during the turns
        "encodes_stepped_aside": preempted,  # aborted for a turn's prompt, added again after
        "think_s": think_s,
        "ratio_p50": _ttft_summary(busy)["p50_s"] / out["chat_idle"]["p50_s"],
        "ratio_p90": _ttft_summary(busy)["p90_s"] / out["chat_idle"]["p90_s"],
        "added_p90_ms": (_ttft_summary(busy)["p90_s"] - out["chat_idle"]["p90_s"]) * 1e3,
    }
    return out


def _ttft_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ttfts = [row["ttft_s"] for row in rows]
    return {
        "turns": len(rows),
        "p50_s": statistics.median(ttfts),
        "p90_s": percentile(ttfts, 0.9),
        "injected_facts_median": statistics.median(r["injected_facts"] for r in rows),
        "text_facts_median": statistics.median(r["text_facts"] for r in rows),
        "samples": rows,
    }


def _until_injectable(session: Any, turn_id: int, t0: float, timeout_s: float) -> float:
    """Seconds from ``t0`` until a fact extracted from ``turn_id`` has its KV recorded."""
    log, fingerprint, w = session.factlog, session.builder.fingerprint, session.config.w
    deadline = t0 + timeout_s
    while time.perf_counter() < deadline:
        for fact in log.active_facts(session.profile_id):
            if turn_id in fact.source_turn_ids and log.kv_key(
                fact.id, fingerprint, w, session.encoding
            ):
                return time.perf_counter() - t0
        time.sleep(0.002)
    raise RuntimeError(f"no fact of turn {turn_id} became injectable in {timeout_s:.0f} s")


def gpu_memory() -> dict[str, float] | None:
    """The process's GPU memory (GiB): what torch holds at its peak, and the device's use now
    (every allocation of the process, vLLM's CUDA graphs included)."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return {
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "used_now_gib": (total - free) / 2**30,
        "total_gib": total / 2**30,
    }


def old_design_extra_gib(model_dir: Path) -> float:
    """What the previous design added: a Hugging Face copy of the weights on the GPU in bf16
    (its encoder), measured by building one with random weights beside the engine."""
    from transformers import AutoConfig, AutoModelForCausalLM

    before = torch.cuda.mem_get_info()[0]
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(str(model_dir)), dtype=torch.bfloat16
        )
    torch.cuda.synchronize()
    extra = (before - torch.cuda.mem_get_info()[0]) / 2**30
    del model
    torch.cuda.empty_cache()
    return extra


def main(argv: Sequence[str] | None = None) -> int:
    from bench.dummy import DUMMY_WEIGHTS, SHAPES, resolve_dummy_config
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig
    from inferscale_core.context_window import WINDOWS
    from inferscale_core.extractor import DeterministicExtractor
    from inferscale_core.session import SessionConfig

    parser = argparse.ArgumentParser(
        prog="python -m bench.app_path", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dummy-config", help=f"dummy weights of a shape ({', '.join(SHAPES)})")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder for --dummy-config")
    parser.add_argument(
        "--weights",
        choices=(*DUMMY_WEIGHTS, "fp8"),
        default="bf16",
        help="dummy weights: bf16, int4 (compressed-tensors W4A16 as GGUF folders; bf16), or"
        " fp8 (bf16 quantized by vLLM as it loads them: the product's weights = fp8)",
    )
    parser.add_argument("--facts", type=int, default=200)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--w", type=int, default=20)
    parser.add_argument("--window", default="anchored", choices=WINDOWS, help="(anchored)")
    parser.add_argument("--gpu-gib", type=float, default=24.0, help="GPU memory budget (24)")
    parser.add_argument("--pool-gib", type=float, default=1.0, help="GPU pool of memories (1)")
    parser.add_argument(
        "--margin-gib",
        type=float,
        default=1.75,
        help="of the budget, kept for what vLLM's profile does not see: the CUDA context, torch"
        " outside vLLM, captured waves compressed on the GPU (1.75; 1.0 came to 24.45 GiB of 24"
        " on the H200, 1.5 to 24.12 on an H100 once the capture compressed on the GPU)",
    )
    parser.add_argument("--old-design", action="store_true", help="also measure a 2nd copy")
    parser.add_argument("--think-s", type=float, default=1.0, help="pause between turns (1.0)")
    parser.add_argument("--step-tokens", type=int, default=None, help="max_num_batched_tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.weights != "bf16" and (not args.dummy_config or args.old_design):
        parser.error(f"--weights {args.weights} is for --dummy-config runs, without --old-design")
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        options: dict[str, Any] = {"max_num_batched_tokens": args.step_tokens}
        embedder = None
        config = AppConfig(
            k=args.k, w=args.w, window=args.window, gpu_pool_gib=args.pool_gib if cuda else 0
        )
        if args.dummy_config:
            stored = "bf16" if args.weights == "fp8" else args.weights
            model_dir = resolve_dummy_config(args.dummy_config, Path(tmp), stored)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(Path(args.tokenizer) / name, model_dir / name)
            config.model = str(model_dir)
            config.weights = "fp8" if args.weights == "fp8" else "auto"
            options["extra"] = {"load_format": "dummy", "skip_tokenizer_init": True}
            embedder = HashEmbedder()
        if cuda:
            total = torch.cuda.mem_get_info()[1] / 2**30
            # vLLM's share of the whole GPU (weights, activations, KV cache); the pool of
            # memories and a margin for what torch keeps outside vLLM's profile come on top.
            share = (args.gpu_gib - args.pool_gib - args.margin_gib) / total
            options.update(gpu_memory_utilization=share, dtype="bfloat16")
        progress("building the assistant")
        assistant = wiring.build(config, store_root=Path(tmp) / "kv", **options)
        sessions = [
            wiring.open_session(
                assistant,
                AppConfig(k=args.k, w=args.w, window=args.window, profile=profile),
                Path(tmp) / "memory.db",
                embedder=embedder,
                extractor=DeterministicExtractor(),
                session_config=SessionConfig(
                    k=args.k, w=args.w, window=args.window, max_tokens=8, history_turns=2
                ),
            )
            for profile in ("user", "other-user")
        ]
        session = sessions[0]
        result: dict[str, Any] = {
            **provenance(
                "app-path",
                f"dummy weights: {args.dummy_config}" if args.dummy_config else "SmolLM2",
                shlex.join(["python", "-m", "bench.app_path", *(argv or sys.argv[1:])]),
            ),
            "gpu": torch.cuda.get_device_name() if cuda else None,
            "k": args.k,
            "w": args.w,
            "window": args.window,
            "embedder": getattr(session.retriever.embedder, "name", "?"),
            "gpu_budget_gib": args.gpu_gib if cuda else None,
            "max_num_batched_tokens": assistant.engine.step_tokens,
            "pool_gib": args.pool_gib if cuda else None,
        }
        try:
            result.update(
                run_app(
                    session,
                    sessions[1],
                    facts=args.facts,
                    backlog=args.backlog,
                    probes=args.probes,
                    questions=args.questions,
                    think_s=args.think_s,
                    seed=args.seed,
                    on_progress=progress,
                )
            )
            result["gpu_memory"] = gpu_memory()
            if cuda and args.old_design:
                progress("measuring a second copy of the weights (the old design)")
                result["old_design_extra_gib"] = old_design_extra_gib(assistant.model_dir)
        finally:
            for opened in sessions:
                opened.close()
    path = Path(args.out_dir) / "app_path.json"
    write_json(result, path)
    print(headline(result))
    print(f"wrote {path}")
    return 0


def headline(result: dict[str, Any]) -> str:
    enc, idle, busy = result["encode"], result["chat_idle"], result["chat_while_encoding"]
    probe = result["turn_to_injectable"]
    parts = [
        f"{enc['facts_encoded']} facts in {enc['seconds']:.1f} s ({enc['facts_per_s']:.1f}/s)",
        f"chat TTFT p50/p90 idle {idle['p50_s'] * 1e3:.0f}/{idle['p90_s'] * 1e3:.0f} ms,"
        f" while encoding {busy['p50_s'] * 1e3:.0f}/{busy['p90_s'] * 1e3:.0f} ms",
        f"turn->injectable p50/p90 {probe['p50_s'] * 1e3:.0f}/{probe['p90_s'] * 1e3:.0f} ms",
    ]
    memory = result.get("gpu_memory")
    if memory:
        parts.append(f"GPU peak {memory['used_now_gib']:.1f} GiB")
        if "old_design_extra_gib" in result:
            parts.append(f"old design +{result['old_design_extra_gib']:.1f} GiB")
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
