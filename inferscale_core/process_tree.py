"""Which processes are below a process, read from ``/proc`` (Linux).

Every ``/proc/<pid>/stat``, not ``/proc/<pid>/task/<tid>/children``: kernels built without the
latter exist. Used by the engine processes' deadline (``vllm_plugin/lifetime.py``: what to end
with the process) and the serve benches (``bench/processes.py``: who spends the CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def proc_stats() -> dict[int, tuple[str, list[str]]]:
    """Every process now: ``{pid: (command name, the fields of its stat from the state on)}``;
    of those fields, [1] is the parent pid, [11] and [12] the user and system CPU ticks."""
    out: dict[int, tuple[str, list[str]]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except (OSError, ValueError):
            continue  # gone meanwhile
        out[int(stat.parent.name)] = (head.split("(", 1)[1], tail.split())
    return out


def tree(root: int, parent_of: Mapping[int, int]) -> list[int]:
    """``root`` (where ``parent_of`` has it) and every process below it, ``root`` first."""
    children: dict[int, list[int]] = {}
    for pid, parent in parent_of.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in parent_of:
            found.append(pid)
            todo += children.get(pid, [])
    return found


def descendants(root: int) -> list[int]:
    """The pids of every process below ``root`` now (children, theirs, ...)."""
    parent_of = {pid: int(fields[1]) for pid, (_, fields) in proc_stats().items()}
    return [pid for pid in tree(root, parent_of) if pid != root]
