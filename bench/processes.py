"""A server's processes, read from ``/proc`` (Linux): who they are, their memory, their CPU.

The serve benches start the server in a process of its own; vLLM's engine core, the API
processes and their helpers are its descendants. These helpers find them all from ``root``
(``inferscale_core/process_tree.py``) and name each by its process title where it set one
(vLLM's ``VLLM::EngineCore``, ours ``inferscale::api-0``), else by its command name.
"""

from __future__ import annotations

import os
from pathlib import Path

from inferscale_core.process_tree import proc_stats, tree

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stats() -> dict[int, tuple[str, int, float]]:
    """Every process now: ``{pid: (command name, parent pid, CPU seconds)}``."""
    return {
        pid: (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
        for pid, (name, fields) in proc_stats().items()
    }


def _title(pid: int, name: str) -> str:
    """The process title a process gave itself (setproctitle), else ``name``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return name
    title = argv[0].decode(errors="replace").strip() if argv else ""
    return title if "::" in title else name


def _tree(root: int, stats: dict[int, tuple[str, int, float]]) -> list[int]:
    return tree(root, {pid: parent for pid, (_, parent, _) in stats.items()})


def process_tree(root: int) -> dict[int, str]:
    """``root`` and its descendants, ``{pid: name}``."""
    stats = _stats()
    return {pid: _title(pid, stats[pid][0]) for pid in _tree(root, stats)}


def process_cpu(root: int) -> dict[int, tuple[str, float]]:
    """``root`` and its descendants, ``{pid: (name, CPU seconds so far)}`` (user + system,
    all threads)."""
    stats = _stats()
    return {pid: (_title(pid, stats[pid][0]), stats[pid][2]) for pid in _tree(root, stats)}


def cpu_between(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], root: int
) -> dict[str, float]:
    """CPU seconds each process spent between two :func:`process_cpu` reads, by name
    (``root`` is ``server``; a name two processes share gets their pids), most first."""
    spent: dict[str, float] = {}
    names = [name for name, _ in after.values()]
    for pid, (name, cpu) in after.items():
        label = "server" if pid == root else name if names.count(name) == 1 else f"{name}:{pid}"
        seconds = cpu - before.get(pid, (name, 0.0))[1]
        if seconds > 0.005:
            spent[label] = round(seconds, 2)
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def resident_kib(pid: int) -> tuple[int, int] | None:
    """``(VmRSS, RssAnon)`` of ``pid`` in KiB; None once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        return int(fields["VmRSS"].split()[0]), int(fields["RssAnon"].split()[0])
    except (KeyError, IndexError, ValueError):
        return None
