"""Child process for the full-disk test: writes to a store under a file size limit.

``python tests/support/full_disk_child.py STORE`` writes one entry, then lowers RLIMIT_FSIZE
(SIGXFSZ ignored, so a real write() fails with EFBIG) below an entry's size and tries a new
entry, a replacement of the old one, a conversion of it and a put another thread waits for.
It prints what it saw as one JSON line; the limit never reaches the parent's pytest.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from inferscale_core.kvstore import KVStore, StoreFullError
from inferscale_core.types import FactKV

LIMIT = 16 << 10  # bytes a file may grow to: below every entry written here (fp8: 24 KiB)


def entry(key: str, seed: int) -> FactKV:
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 4, 24, 2, 64, generator=gen)  # [layers, tokens, kv_heads, head_dim]
    return FactKV(key, list(range(24)), k, v, "fp")  # 48 KiB of K and V: above LIMIT


def attempt(fn) -> dict:
    try:
        fn()
    except StoreFullError as exc:
        return {"error": type(exc).__name__, "errno": exc.errno, "message": str(exc)}
    except Exception as exc:  # reported, for the parent to show
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def main(root: Path) -> None:
    store = KVStore(root, fingerprint="fp", store_dtype="model")
    old = entry("fact-old", 1)
    store.put(old)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    seen = {
        "new": attempt(lambda: store.put(entry("fact-new", 2))),
        "replace": attempt(lambda: store.put(entry("fact-old", 3))),
        "convert": attempt(lambda: store.convert("fact-old", "fp8")),
    }
    writer = threading.Thread(target=attempt, args=(lambda: store.put(entry("fact-late", 4)),))
    t0 = time.monotonic()
    writer.start()
    seen["wait_for"] = attempt(lambda: store.wait_for(["fact-late"], timeout=60))
    seen["wait_for"]["seconds"] = time.monotonic() - t0
    writer.join()
    reread = KVStore(root, fingerprint="fp")  # a fresh store reads the file, not RAM
    found = reread.get("fact-old")
    seen["old_scheme"] = reread.stored_scheme("fact-old")
    seen["old_intact"] = bool(torch.equal(found.k, old.k) and torch.equal(found.v, old.v))
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
