"""``bench serve``: the assistant's HTTP server under load, KV injection against prompt
injection through the same server.

``python -m bench.serve_http OUT [--dummy-config llama-3.1-8b --tokenizer DIR] …`` makes
``--users`` users (the real ``Users``), starts the real server in a process of its own (vLLM's
engine core and workers in theirs, as ``serve`` runs them), gives each user ``--facts``
statements through ``POST /v1/memories``, waits until all are encoded, then measures from
this process, over HTTP (streamed chat completions, ``store: false``, a fresh question each):

* **TTFT per k**: one user, one request at a time, ``--runs`` per k in ``--ks`` and mode
  (``"memory": {"mode": "inject"|"prompt", "k": k}``): time to the first content chunk;
* **throughput**: every user sends one request at once (k = ``--k``, ``--max-tokens``
  tokens), per mode: requests per second = users / wall time of the wave, TTFT p50/p90.

Each user's question retrieves its own facts (a hashing embedder on dummy weights: the GPU
image has no MiniLM; MiniLM on the CPU), so prompt injection gets no prefix-cache hits from
another user (cache salts are per user) or from an earlier wave. ``OUT/serve_http.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.processes import cpu_between, process_cpu
from bench.report import percentile, provenance, write_json

STATUS_TIMEOUT_S = 900.0
CONNECTIONS_PER_USER = 8


# ---- the server's process ----
def serve(args: argparse.Namespace) -> None:
    """Build the assistant (serving engine) and run the HTTP server until killed."""
    from app.serve.launch import ServeRecipe
    from app.serve.launch import serve as run
    from bench.app_path import HashEmbedder
    from inferscale_core.config import AppConfig

    data = Path(args.data_dir)
    if os.environ.get("SERVE_PROFILE"):
        ThreadCpu(Path(os.environ["SERVE_PROFILE"]))
    config = AppConfig(k=args.k, w=0, recompute=0, extractor="deterministic")
    options: dict[str, Any] = {"max_num_batched_tokens": args.step_tokens}
    embedder = None
    if args.dummy_config:
        from bench.dummy import resolve_dummy_config

        model_dir = resolve_dummy_config(args.dummy_config, data)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(args.tokenizer) / name, model_dir / name)
        config.model = str(model_dir)
        # The tokenizer stays on: the server streams text (ids beyond its vocabulary decode
        # to nothing; the first token's chunk is sent even so).
        options["extra"] = {"load_format": "dummy"}
        options.update(dtype="bfloat16", max_model_len=8192, gpu_memory_utilization=0.5)
        # A GPU pool of entries in the worker (and host RAM beside). The in-process suite's
        # 260 shared facts fit its 4 GiB; 100 users x 60 facts of their own are ~42 GiB of
        # bf16 K+V on this shape, so a pool smaller than that reloads most of them each wave.
        gpu_bytes = int(args.gpu_pool_gib * (1 << 30))
        options["connector_extra"] = {"gpu_bytes": gpu_bytes, "host_bytes": 16 << 30}
        embedder = HashEmbedder
    else:
        options.update(max_model_len=4096)
    recipe = ServeRecipe(config, data, options, model_name="bench", embedder=embedder)
    if not args.ray:
        run(recipe, "127.0.0.1", args.port, args.api_processes)
        return
    from app.serve.ray_app import RaySettings, serve_ray

    # N replicas on one host: each its share of the GPU, of vLLM's memory and of the pool.
    share = 1.0 / args.ray
    if "gpu_memory_utilization" in options:
        options["gpu_memory_utilization"] *= share
        options["connector_extra"]["gpu_bytes"] = int(gpu_bytes * share)
    on_gpu = args.dummy_config is not None
    settings = RaySettings(replicas=args.ray, gpus_per_replica=share if on_gpu else 0.0)
    serve_ray(recipe, "127.0.0.1", args.port, settings)


class ThreadCpu:
    """CPU seconds of this process's threads by name (``SERVE_PROFILE=file``, Linux): every
    0.5 s ``{name: seconds}`` (names without their numbers, summed) goes to ``file``, so
    the load can difference two reads around a wave and see who spends the time."""

    def __init__(self, path: Path) -> None:
        import threading

        self.path = path
        threading.Thread(target=self._run, daemon=True, name="thread-cpu").start()

    def _run(self) -> None:
        import re
        import threading

        tick = os.sysconf("SC_CLK_TCK")
        while True:
            names = {t.native_id: t.name for t in threading.enumerate()}
            totals: dict[str, float] = {}
            for task in Path("/proc/self/task").iterdir():
                try:
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                seconds = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
                name = re.sub(r"[-_]?\d+(_\d+)?$", "", names.get(int(task.name), "native"))
                totals[name] = totals.get(name, 0.0) + seconds
            self.path.write_text(json.dumps(totals))
            time.sleep(0.5)


def cpu_by_thread(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    for _ in range(20):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    return {}


# ---- the load, from this process ----
def statements(n: int, seed: int) -> list[str]:
    """``n`` facts of about 55 tokens, distinct words each (bench.app_path's, two a fact)."""
    from bench.app_path import statements as one_each

    words = [f"{a}{b}{c}" for a in "bcdfgk" for b in "aeiou" for c in ("lor", "mek", "stan")]
    first, second = one_each(n, seed, words), one_each(n, seed + 1, words)
    return [f"{a} {b}" for a, b in zip(first, second, strict=True)]


class Load:
    """The users' clients: one ``httpx.AsyncClient`` each, as separate users have (one pool
    of 100 streams costs its process quadratic bookkeeping: httpcore scans the pool on every
    event; on the H200 that client, not the server, took 2.6 s of CPU in a 2.7 s wave)."""

    def __init__(
        self, base: str, tokens: dict[str, str], max_tokens: int, model: str = "bench"
    ) -> None:
        import httpx

        self.base, self.tokens, self.max_tokens, self.model = base, tokens, max_tokens, model
        limits = httpx.Limits(max_connections=CONNECTIONS_PER_USER)
        self.clients = {
            user: httpx.AsyncClient(base_url=base, limits=limits, timeout=600) for user in tokens
        }
        self.direct: dict[str, Any] = {}  # a client per user to its API process (--direct)
        self.asked = 0

    def go_direct(self, sockets: Sequence[Path]) -> None:
        """Clients for the API processes' own sockets, past the front: :meth:`ask` with
        ``direct=True`` sends each user's request to the process that owns the user."""
        import httpx

        from app.serve.front import owner

        limits = httpx.Limits(max_connections=CONNECTIONS_PER_USER)
        self.direct = {
            user: httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(
                    uds=str(sockets[owner(user, len(sockets))]), limits=limits
                ),
                base_url="http://inferscale-api/v1",
                timeout=600,
            )
            for user in self.tokens
        }

    def client_for(self, user: str, direct: bool = False) -> Any:
        return (self.direct if direct else self.clients)[user]

    def auth(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    async def remember(self, facts: dict[str, list[str]], concurrency: int = 32) -> float:
        gate = asyncio.Semaphore(concurrency)

        async def one(user: str, text: str) -> None:
            async with gate:
                r = await self.client_for(user).post(
                    "/memories", json={"text": text}, headers=self.auth(user)
                )
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(u, t) for u, texts in facts.items() for t in texts))
        return time.perf_counter() - t0

    async def wait_encoded(self) -> float:
        t0 = time.perf_counter()
        for user in self.tokens:
            while True:
                r = await self.client_for(user).get("/status", headers=self.auth(user))
                if r.json()["memory"]["not_encoded"] == 0:
                    break
                if time.perf_counter() - t0 > STATUS_TIMEOUT_S:
                    raise TimeoutError(f"{user}: facts not encoded: {r.json()}")
                await asyncio.sleep(0.5)
        return time.perf_counter() - t0

    def body(
        self, mode: str, k: int, *, stream: bool = True, store: bool = False
    ) -> dict[str, Any]:
        """A chat completion request with a fresh question."""
        self.asked += 1
        return {
            "model": self.model,
            "messages": [
                {"role": "user", "content": f"What did my friend say on day {self.asked}?"}
            ],
            # Every reply max_tokens long, as the in-process suite's (ignore_eos there):
            # equal work on both sides of a comparison.
            "max_tokens": self.max_tokens,
            "min_tokens": self.max_tokens,
            "temperature": 0,
            "stream": stream,
            "store": store,
            **({"stream_options": {"include_usage": True}} if stream else {}),
            "memory": {"mode": mode, "k": k},
        }

    async def ask(
        self,
        user: str,
        mode: str,
        k: int,
        *,
        store: bool = False,
        hang_up: int = 0,
        direct: bool = False,
    ) -> dict[str, Any]:
        """One streamed request: client TTFT (the first token's chunk), total, what it
        used. ``hang_up``: close the connection after that many chunks (the server aborts
        the request); ``direct``: to the user's API process, past the front."""
        body = self.body(mode, k, store=store)
        t0 = time.perf_counter()
        ttft, last, chunks = None, {}, 0
        async with self.client_for(user, direct).stream(
            "POST", "/chat/completions", json=body, headers=self.auth(user)
        ) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                piece = json.loads(line[6:])
                if "error" in piece:
                    raise RuntimeError(piece["error"]["message"])
                chunks += 1
                # The chunk after the role's carries the first token (text or not yet).
                if ttft is None and chunks == 2:
                    ttft = time.perf_counter() - t0
                last = piece
                if chunks == hang_up:
                    break
        memories = last.get("memories") or []
        return {
            "ttft_s": ttft,
            "total_s": time.perf_counter() - t0,
            "completion_tokens": (last.get("usage") or {}).get("completion_tokens"),
            "memories": len(memories),
            "injected": sum(1 for m in memories if m["how"] == "injected"),
        }

    async def close(self) -> None:
        for client in (*self.clients.values(), *self.direct.values()):
            await client.aclose()


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ttfts = sorted(r["ttft_s"] for r in rows if r["ttft_s"] is not None)
    return {
        "n": len(rows),
        "ttft_ms_p50": 1e3 * statistics.median(ttfts) if ttfts else None,
        "ttft_ms_p90": 1e3 * percentile(ttfts, 0.9) if ttfts else None,
        "memories": statistics.median(r["memories"] for r in rows),
        "injected": statistics.median(r["injected"] for r in rows),
    }


async def measure(
    load: Load, args: argparse.Namespace, users: list[str], server_pid: int | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {"ttft": [], "throughput": {}}
    for mode in ("inject", "prompt"):  # warm-up: first requests pay one-time costs
        for _ in range(3):
            await load.ask(users[0], mode, args.k)
    for k in args.ks:
        for mode in ("inject", "prompt"):
            rows = [await load.ask(users[0], mode, k) for _ in range(args.runs)]
            result["ttft"].append({"k": k, "mode": mode, **summary(rows)})
            print(f"ttft k={k} {mode}: {result['ttft'][-1]}", flush=True)
    # One wave first: every user's entries reach the worker's GPU pool (as the in-process
    # suite prefetches its pool before timing), and one-time costs are paid.
    await asyncio.gather(*(load.ask(u, "inject", args.k) for u in users))
    if load.direct:  # the direct clients' connections too
        await asyncio.gather(*(load.ask(u, "inject", args.k, direct=True) for u in users))
    profile = Path(os.environ["SERVE_PROFILE"]) if os.environ.get("SERVE_PROFILE") else None
    # "inject-direct": the same as "inject", each request sent to its user's API process
    # past the front (what the front costs).
    modes = ["inject", "prompt", *(["inject-direct"] if load.direct else [])]
    waves: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(args.waves):  # the modes alternate: a drift of the machine hits all
        for mode in modes:
            how, direct = mode.removesuffix("-direct"), mode.endswith("-direct")
            await asyncio.sleep(0.6)
            before = cpu_by_thread(profile)
            processes = process_cpu(server_pid) if server_pid else {}
            t0, cpu0 = time.perf_counter(), time.process_time()
            rows = await asyncio.gather(*(load.ask(u, how, args.k, direct=direct) for u in users))
            wall, load_cpu = time.perf_counter() - t0, time.process_time() - cpu0
            by_process = (
                cpu_between(processes, process_cpu(server_pid), server_pid) if server_pid else {}
            )
            await asyncio.sleep(0.6)
            after = cpu_by_thread(profile)
            cpu = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items()}
            cpu = {k: v for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v > 0}
            waves[mode].append(
                {
                    "wall_s": wall,
                    "requests_per_s": len(users) / wall,
                    "completion_tokens": statistics.median(
                        r["completion_tokens"] or 0 for r in rows
                    ),
                    **summary(rows),
                    "server_cpu_s_by_thread": cpu,  # with SERVE_PROFILE (wave + 1.2 s)
                    # each of the server's processes during the wave (its wall_s bounds
                    # what one thread can spend)
                    "server_cpu_s_by_process": by_process,
                    "load_cpu_s": round(load_cpu, 2),  # this process's (the clients')
                }
            )
            print(
                f"throughput {mode}: {len(users) / wall:.1f} req/s in {wall:.2f} s;"
                f" processes' CPU {by_process}; load CPU {load_cpu:.2f} s; threads {cpu}",
                flush=True,
            )
    for mode, done in waves.items():  # the median wave by requests per second
        middle = sorted(done, key=lambda w: w["requests_per_s"])[len(done) // 2]
        result["throughput"][mode] = {
            "users": len(users),
            "k": args.k,
            "max_tokens": args.max_tokens,
            "api_processes": args.api_processes,
            **middle,
            "waves_requests_per_s": [round(w["requests_per_s"], 2) for w in done],
        }
    tput = result["throughput"]
    result["throughput_ratio"] = tput["inject"]["requests_per_s"] / tput["prompt"]["requests_per_s"]
    if "inject-direct" in tput:  # > 1: the front slows injection down
        result["direct_over_front"] = (
            tput["inject-direct"]["requests_per_s"] / tput["inject"]["requests_per_s"]
        )
    return result


@dataclass(slots=True)
class Running:
    """A server started by :func:`running_server`."""

    process: subprocess.Popen[bytes]
    port: int
    tokens: dict[str, str]  # user name -> API token
    start_s: float  # until /health answered

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextlib.contextmanager
def running_server(args: argparse.Namespace, out: Path, names: Sequence[str]) -> Iterator[Running]:
    """Users ``names`` (the real ``Users``) and the server over them, in a process of its own
    (its log: ``OUT/serve_http_server.log``); stopped, and its data removed, on exit."""
    from app.serve.users import Users

    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    users_db = Users(data / "users.db")
    tokens = {name: users_db.add(name) for name in names}
    users_db.close()
    port = free_port()
    command = [sys.executable, "-m", "bench.serve_http", "_serve", "--data-dir", str(data)]
    command += ["--port", str(port), "--k", str(args.k), "--step-tokens", str(args.step_tokens)]
    command += ["--gpu-pool-gib", str(args.gpu_pool_gib)]
    command += ["--api-processes", str(args.api_processes), "--ray", str(args.ray)]
    if args.dummy_config:
        command += ["--dummy-config", args.dummy_config, "--tokenizer", str(args.tokenizer)]
    with (out / "serve_http_server.log").open("wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        started = wait_healthy(port, server, args.start_timeout)
        print(f"server up in {started:.0f} s", flush=True)
        yield Running(server, port, tokens, started)
    finally:
        stop(server)
        shutil.rmtree(data, ignore_errors=True)


async def seed(load: Load, per_user: int) -> dict[str, float]:
    """``per_user`` facts for each of the load's users through ``POST /v1/memories``, then
    wait until the server has encoded them all."""
    facts = {name: statements(per_user, i) for i, name in enumerate(load.tokens)}
    added = await load.remember(facts)
    encoded = await load.wait_encoded()
    print(
        f"{len(facts) * per_user} facts added in {added:.1f} s, encoded {encoded:.1f} s after",
        flush=True,
    )
    return {"facts_added_s": added, "facts_encoded_after_s": encoded}


def run(args: argparse.Namespace) -> int:
    out = Path(args.out_dir)
    names = [f"user{i:03d}" for i in range(args.users)]
    t0 = time.perf_counter()
    with running_server(args, out, names) as server:

        async def main() -> dict[str, Any]:
            load = Load(server.base, server.tokens, args.max_tokens)
            if args.direct:
                load.go_direct(api_sockets(args.api_processes))
            try:
                seeded = await seed(load, args.facts)
                return {**await measure(load, args, names, server.process.pid), **seeded}
            finally:
                await load.close()

        result = asyncio.run(main())
    result = {
        **provenance("serve_http", args.dummy_config or "SmolLM2-135M-Instruct", args.command),
        "server_start_s": server.start_s,
        "users": args.users,
        "facts_per_user": args.facts,
        "gpu_pool_gib": args.gpu_pool_gib,
        "api_processes": args.api_processes,
        "ray_replicas": args.ray,
        "wall_s": time.perf_counter() - t0,
        **result,
    }
    write_json(result, out / "serve_http.json")
    print(json.dumps({"throughput_ratio": result["throughput_ratio"]}), flush=True)
    return 0


def api_sockets(count: int) -> list[Path]:
    """The Unix sockets of the newest server's ``count`` API processes (``serve
    --api-processes``: ``api-<i>.sock`` in a ``inferscale-serve-*`` folder of the temporary
    directory)."""
    if count < 2:
        raise SystemExit("--direct needs --api-processes 2 or more (one process has no front)")
    folders = sorted(
        Path(tempfile.gettempdir()).glob("inferscale-serve-*"), key=lambda p: p.stat().st_mtime
    )
    for folder in reversed(folders):
        sockets = [folder / f"api-{i}.sock" for i in range(count)]
        if all(path.is_socket() for path in sockets):
            return sockets
    raise RuntimeError(f"no folder of {count} API sockets in {tempfile.gettempdir()}")


def stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (its engine processes too), SIGKILL after 60 s."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(port: int, server: subprocess.Popen[bytes], timeout: float) -> float:
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}); see its log")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).is_success:
                return time.perf_counter() - t0
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the server did not start in {timeout:.0f} s")


def server_arguments(parser: argparse.ArgumentParser, users: int, facts: int, k: int) -> None:
    """The options of the server and its users (this bench's, and ``bench.serve_soak``'s)."""
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dummy-config", help="dummy weights of a model shape (llama-3.1-8b)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder for --dummy-config")
    parser.add_argument("--users", type=int, default=users, help=f"users ({users})")
    parser.add_argument("--facts", type=int, default=facts, help=f"facts per user ({facts})")
    parser.add_argument("--k", type=int, default=k, help=f"memories per request ({k})")
    parser.add_argument("--max-tokens", type=int, default=32, help="reply tokens (32)")
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=0,
        help="max_num_batched_tokens (0: vLLM's own, as the in-process throughput suite)",
    )
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument(
        "--gpu-pool-gib",
        type=float,
        default=4.0,
        help="the worker's GPU pool of entries with --dummy-config, GiB (4; the users' facts"
        " stay resident only when it holds them all)",
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="the server's API processes over its one engine (serve --api-processes; 1)",
    )
    parser.add_argument(
        "--ray",
        type=int,
        default=0,
        metavar="N",
        help="serve --ray N instead: N replicas on Ray Serve, each its share of the GPU (0: no)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench.serve_http", description=__doc__)
    if argv[:1] == ["_serve"]:
        parser.add_argument("--data-dir", required=True)
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--k", type=int, default=50)
        parser.add_argument("--step-tokens", type=int, default=0)
        parser.add_argument("--dummy-config")
        parser.add_argument("--tokenizer")
        parser.add_argument("--gpu-pool-gib", type=float, default=4.0)
        parser.add_argument("--api-processes", type=int, default=1)
        parser.add_argument("--ray", type=int, default=0)
        serve(parser.parse_args(argv[1:]))
        return 0
    server_arguments(parser, users=100, facts=60, k=50)
    parser.add_argument("--ks", default="5,20,50", help="k of the TTFT sweep (5,20,50)")
    parser.add_argument("--runs", type=int, default=10, help="TTFT requests per k and mode (10)")
    parser.add_argument(
        "--waves", type=int, default=3, help="throughput waves per mode, the median kept (3)"
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="with --api-processes N > 1: injection waves past the front too, each request"
        " to its user's API process (what the front costs)",
    )
    args = parser.parse_args(argv)
    args.ks = [int(k) for k in args.ks.split(",") if k]
    args.command = "python -m bench.serve_http " + " ".join(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
