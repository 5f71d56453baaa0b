"""``die_with_parent`` with real processes: a child that shuts down on SIGTERM goes with its
parent at once; one whose shutdown hangs goes at the deadline, with its own children, and says
where its threads were. The parent has threads of its own, as a server has: the child must get
one SIGTERM however many of them end (vLLM's SIGTERM handler hangs on a second)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# The parent: threads, then the child (argv: its code, then its argv); waits to be killed.
PARENT = """
import subprocess, sys, threading, time
for _ in range(8):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], stderr=open(sys.argv[4], "w"))
time.sleep(600)
"""
# The child: a grandchild of its own, then die_with_parent; argv: mode, pids file, stderr file,
# the deadline.
CHILD = """
import os, signal, subprocess, sys, time
from inferscale_core.vllm_plugin.lifetime import die_with_parent
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if sys.argv[1] == "hangs":  # a shutdown that never ends: each SIGTERM only said on stderr
    signal.signal(signal.SIGTERM, lambda *_: os.write(2, b"SIGTERM\\n"))
else:  # a shutdown as vLLM's: its children stopped, then out
    signal.signal(signal.SIGTERM, lambda *_: (grandchild.kill(), grandchild.wait(), os._exit(0)))
assert die_with_parent(os.getppid(), grace_s=float(sys.argv[4]))
open(sys.argv[2], "w").write(f"{os.getpid()} {grandchild.pid}")
while True:
    time.sleep(0.1)
"""


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, ended but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def kill_parent_and_time(tmp_path: Path, hangs: bool) -> tuple[float, str]:
    """Start parent → child → grandchild, SIGKILL the parent; seconds until child and
    grandchild are gone, and the child's stderr."""
    pids_file, stderr = tmp_path / "pids", tmp_path / "stderr"
    mode, grace_s = ("hangs", "1") if hangs else ("ends", "20")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, mode, str(pids_file), str(stderr), grace_s],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (pids_file.exists() and pids_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(pid) for pid in pids)
        parent.kill()
        parent.wait()
        t0 = time.monotonic()
        while any(alive(pid) for pid in pids) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        gone_s = time.monotonic() - t0
        assert not any(alive(pid) for pid in pids), "outlived the parent by 30 s"
        return gone_s, stderr.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


def test_a_child_that_shuts_down_on_sigterm_goes_with_its_parent(tmp_path):
    gone_s, said = kill_parent_and_time(tmp_path, hangs=False)
    assert gone_s < 10  # by the SIGTERM (the parent is looked at every 0.5 s), not the deadline
    assert "is gone and this one has not shut down" not in said


def test_a_hung_shutdown_ends_at_the_deadline_children_included(tmp_path):
    gone_s, said = kill_parent_and_time(tmp_path, hangs=True)
    assert 1.0 <= gone_s < 10
    assert said.count("SIGTERM\n") == 1
    assert "is gone and this one has not shut down 1 s later" in said
    assert "most recent call first" in said  # where each thread was
