"""``bench serve soak``: the assistant's HTTP server under a bounded load for a while, its
resident memory sampled (issue 18: flat, within +10%, over 10 minutes on the CPU).

``python -m bench.serve_soak OUT --seconds 600`` starts the server as ``bench.serve_http``
does (``--users`` users with ``--facts`` facts each, encoded), then ``--clients`` clients
loop until the time is up, each request for the next user in turn, a fixed mix (:data:`MIX`):

* chat completions with k = ``--k`` memories (a fifth in the prompt, the rest injected),
  streamed or not, some logged (``"store": true``: the memory worker reads their turns);
* streamed ones the client hangs up on after a few chunks (the server aborts them);
* ``POST /v1/memories`` (encoded in the background) and, once the client has added
  :data:`OWN_FACTS`, ``DELETE`` of its oldest instead (the active facts stay about as many,
  the fact log grows); ``POST /v1/memories/search``; ``GET /v1/status``.

Every ``--sample-s`` the resident memory (``VmRSS``, and its anonymous part ``RssAnon``) of
the server's process and of each of its descendants (vLLM's engine core) is read from
``/proc``. The baseline is the first sample at or after ``--warmup-s``; the report gives the
sum's and each process's baseline, end, max and growth, the requests done per kind with their
latency, and the errors: any unexpected status, error event or exception (there should be
none; the exit status is 1 otherwise). ``OUT/serve_soak.json``. :func:`soak` drives a server
started elsewhere too (the serve tests' own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import process_tree, resident_kib
from bench.report import percentile, provenance, write_json
from bench.serve_http import Load, running_server, seed, server_arguments, statements

MIX = {  # kind -> weight
    "stream": 30,
    "stream_logged": 15,
    "complete": 15,
    "hang_up": 10,
    "memory": 15,  # "remember" or "forget"
    "search": 10,
    "status": 5,
}
HANG_UP_AFTER = 3  # chunks a client reads before it goes away
OWN_FACTS = 3  # facts a client adds before it forgets its oldest
PROMPT_SHARE = 0.2  # chats with their memories in the prompt instead of injected


@dataclass(slots=True)
class SoakSettings:
    seconds: float  # of load, the warm-up included
    clients: int = 6
    k: int = 5
    warmup_s: float = 60.0  # the baseline is the first sample at or after it
    sample_s: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_s < self.seconds:
            raise ValueError(f"warm-up {self.warmup_s} s must be shorter than {self.seconds} s")
        if self.clients < 1 or self.sample_s <= 0:
            raise ValueError("at least one client, and a positive sampling period")


@dataclass(slots=True)
class Tally:
    seconds: dict[str, list[float]] = field(default_factory=dict)  # kind -> each one's
    errors: list[str] = field(default_factory=list)  # "kind: what", in order

    def summary(self) -> dict[str, Any]:
        by_kind = {
            kind: {
                "n": len(times),
                "p50_s": round(statistics.median(times), 3),
                "p90_s": round(percentile(times, 0.9), 3),
            }
            for kind, times in sorted(self.seconds.items())
        }
        total = sum(len(times) for times in self.seconds.values())
        return {
            "requests": total,
            "by_kind": by_kind,
            "errors": len(self.errors),
            "error_examples": self.errors[:10],
        }


# ---- resident memory of the server's processes ----
def sample(root: int, t: float) -> dict[str, Any]:
    """The resident memory of ``root``'s tree now, summed and per process."""
    processes: dict[str, dict[str, Any]] = {}
    for pid, name in process_tree(root).items():
        kib = resident_kib(pid)
        if kib is not None:
            processes[str(pid)] = {"name": name, "rss_kib": kib[0], "anon_kib": kib[1]}
    return {
        "t_s": round(t, 1),
        "rss_kib": sum(p["rss_kib"] for p in processes.values()),
        "anon_kib": sum(p["anon_kib"] for p in processes.values()),
        "processes": processes,
    }


def _growth(kib: Sequence[int]) -> dict[str, float]:
    base, end, top = kib[0], kib[-1], max(kib)
    return {
        "baseline_mib": round(base / 1024, 1),
        "end_mib": round(end / 1024, 1),
        "max_mib": round(top / 1024, 1),
        "growth_pct": round(100 * (end - base) / base, 2),
        "max_growth_pct": round(100 * (top - base) / base, 2),
    }


def growth(samples: Sequence[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """Baseline (the first sample at or after ``warmup_s``), end, max and growth: of the sum
    (``VmRSS`` and ``RssAnon``) and of each process (from its first sample on)."""
    measured = [s for s in samples if s["t_s"] >= warmup_s] or list(samples[-1:])
    per_process = []
    for pid in dict.fromkeys(p for s in measured for p in s["processes"]):
        mine = [s["processes"][pid] for s in measured if pid in s["processes"]]
        per_process.append(
            {
                "pid": int(pid),
                "name": mine[0]["name"],
                **_growth([p["rss_kib"] for p in mine]),
                "anon": _growth([p["anon_kib"] for p in mine]),
            }
        )
    return {
        "baseline_t_s": measured[0]["t_s"],
        **_growth([s["rss_kib"] for s in measured]),
        "anon": _growth([s["anon_kib"] for s in measured]),
        "processes": per_process,
    }


# ---- the load ----
async def request(
    load: Load, kind: str, user: str, k: int, rng: random.Random, own: list[tuple[str, int]]
) -> str:
    """One request of ``kind`` for ``user``; returns the kind done ("memory" is "remember"
    or "forget"). Raises on an unexpected status or an error event."""
    mode = "prompt" if rng.random() < PROMPT_SHARE else "inject"
    client, auth = load.client_for(user), load.auth(user)
    if kind in ("stream", "stream_logged", "hang_up"):
        hang_up = HANG_UP_AFTER if kind == "hang_up" else 0
        await load.ask(user, mode, k, store=kind == "stream_logged", hang_up=hang_up)
        return kind
    if kind == "complete":
        body = load.body(mode, k, stream=False)
        r = await client.post("/chat/completions", json=body, headers=auth)
        _expect(r, 200)
        r.json()["choices"][0]["message"]["content"]  # a KeyError if it is not a completion
        return kind
    if kind == "memory" and len(own) >= OWN_FACTS:
        owner, fact_id = own.pop(0)
        _expect(
            await load.client_for(owner).delete(f"/memories/{fact_id}", headers=load.auth(owner)),
            204,
        )
        return "forget"
    if kind == "memory":
        text = f"{statements(1, rng.randrange(1 << 30))[0]} Note {rng.randrange(1 << 30)}."
        r = await client.post("/memories", json={"text": text}, headers=auth)
        _expect(r, 201)
        own.append((user, r.json()["id"]))
        return "remember"
    if kind == "search":
        question = load.body(mode, k)["messages"][0]["content"]
        r = await client.post("/memories/search", json={"query": question, "k": k}, headers=auth)
        _expect(r, 200)
        return kind
    _expect(await client.get("/status", headers=auth), 200)
    return kind


def _expect(response: Any, status: int) -> None:
    if response.status_code != status:
        raise RuntimeError(f"HTTP {response.status_code} (not {status}): {response.text[:200]}")


async def client(
    load: Load, settings: SoakSettings, number: int, deadline: float, tally: Tally
) -> None:
    """Requests until ``deadline``, one at a time, for the load's users in turn."""
    rng = random.Random(settings.seed * 1000 + number)
    users, kinds, weights = list(load.tokens), list(MIX), list(MIX.values())
    own: list[tuple[str, int]] = []  # (user, fact id) this client added and did not forget
    turn = number
    while time.monotonic() < deadline:
        user, kind = users[turn % len(users)], rng.choices(kinds, weights)[0]
        turn += 1
        t0 = time.perf_counter()
        try:
            kind = await request(load, kind, user, settings.k, rng, own)
        except Exception as exc:  # counted, and the client goes on
            tally.errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])
            continue
        tally.seconds.setdefault(kind, []).append(time.perf_counter() - t0)


async def soak(
    base: str,
    tokens: dict[str, str],
    server_pid: int,
    settings: SoakSettings,
    *,
    model: str = "bench",
    max_tokens: int = 32,
) -> dict[str, Any]:
    """Drive the server at ``base`` (process ``server_pid``, its users' ``tokens``) for
    ``settings.seconds``, sampling its processes' resident memory; the report."""
    load = Load(base, tokens, max_tokens, model)
    tally, samples = Tally(), []
    t0 = time.monotonic()

    async def sampler() -> None:
        at = t0
        while True:
            samples.append(await asyncio.to_thread(sample, server_pid, time.monotonic() - t0))
            last = samples[-1]
            done = sum(len(v) for v in tally.seconds.values())
            print(
                f"t={last['t_s']:.0f} s: RSS {last['rss_kib'] / 1024:.0f} MiB,"
                f" {done} requests, {len(tally.errors)} errors",
                flush=True,
            )
            at += settings.sample_s
            await asyncio.sleep(max(0.0, at - time.monotonic()))

    watch = asyncio.create_task(sampler())
    try:
        deadline = t0 + settings.seconds
        await asyncio.gather(
            *(client(load, settings, i, deadline, tally) for i in range(settings.clients))
        )
        statuses = {}
        for user in tokens:
            status = (await load.client_for(user).get("/status", headers=load.auth(user))).json()
            statuses[user] = status["memory"]
    finally:
        watch.cancel()
        await load.close()
    samples.append(sample(server_pid, time.monotonic() - t0))
    return {
        "seconds": settings.seconds,
        "clients": settings.clients,
        "k": settings.k,
        "max_tokens": max_tokens,
        "mix": MIX,
        "warmup_s": settings.warmup_s,
        "load_wall_s": round(time.monotonic() - t0, 1),
        **tally.summary(),
        "memory_at_end": statuses,
        "requests_in_engine_at_end": status["requests_in_engine"],  # hung-up ones gone
        "rss": growth(samples, settings.warmup_s),
        "samples": samples,
    }


def run(args: argparse.Namespace) -> int:
    out = Path(args.out_dir)
    names = [f"user{i:03d}" for i in range(args.users)]
    settings = SoakSettings(args.seconds, args.clients, args.k, args.warmup_s, args.sample_s)
    with running_server(args, out, names) as server:

        async def main() -> dict[str, Any]:
            load = Load(server.base, server.tokens, args.max_tokens)
            try:
                seeded = await seed(load, args.facts)
            finally:
                await load.close()
            pid, tokens = server.process.pid, server.tokens
            ran = await soak(server.base, tokens, pid, settings, max_tokens=args.max_tokens)
            return {**seeded, **ran}

        result = asyncio.run(main())
    result = {
        **provenance("serve_soak", args.dummy_config or "SmolLM2-135M-Instruct", args.command),
        "server_start_s": server.start_s,
        "users": args.users,
        "facts_per_user": args.facts,
        **result,
    }
    write_json(result, out / "serve_soak.json")
    rss = result["rss"]
    headline = {k: rss[k] for k in ("baseline_mib", "end_mib", "max_mib", "growth_pct")}
    print(json.dumps({"requests": result["requests"], "errors": result["errors"], **headline}))
    return 0 if result["errors"] == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench.serve_soak", description=__doc__)
    server_arguments(parser, users=4, facts=12, k=5)
    parser.add_argument("--seconds", type=float, default=600.0, help="of load (600)")
    parser.add_argument("--clients", type=int, default=6, help="concurrent clients (6)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="before the baseline (60)")
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period (10)")
    args = parser.parse_args(argv)
    args.command = "python -m bench.serve_soak " + " ".join(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
