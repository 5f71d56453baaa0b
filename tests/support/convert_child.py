"""Child process for the kill -9 test: convert a store's entries to int4, one by one.

``python tests/support/convert_child.py STORE KEY...`` prints "started", then converts each
key's entry (``KVStore.convert``; an entry converted already is skipped), printing "converted"
after each one it rewrote, and prints "done". The parent SIGKILLs it after a random number of
conversions (and a random moment into the next) and runs it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from inferscale_core.kvstore import KVStore


def main(root: Path, keys: list[str]) -> None:
    store = KVStore(root, fingerprint="fp", store_dtype="int4")
    print("started", flush=True)
    for key in keys:
        if store.convert(key):
            print("converted", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
