"""Child process for the crash test: encode every pending fact of a fact log, then exit.

``python tests/support/memory_worker_child.py DB STORE MODEL_DIR`` runs the real background worker
(HF reference encoder, deterministic extractor, w=0) until nothing is pending. The parent
SIGKILLs it mid-way and runs it again.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(db: Path, store_root: Path, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from inferscale_core.composer import ChatLayout
    from inferscale_core.extractor import DeterministicExtractor
    from inferscale_core.factlog import FactLog
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.kvstore import KVStore
    from inferscale_core.memory_worker import MemoryWorker
    from inferscale_core.prompt_builder import PromptBuilder
    from tests.support.hf_encoder import HFReferenceEncoder

    fingerprint = model_fingerprint(model_dir)
    layout = ChatLayout(AutoTokenizer.from_pretrained(str(model_dir)), "Test system prompt.")
    store = KVStore(store_root, fingerprint=fingerprint)
    encoder = HFReferenceEncoder(model_dir, fingerprint)  # the oracle: no engine in the child
    encoder.store = store
    builder = PromptBuilder(layout, encoder, store, batch_size=32)
    profile_id = FactLog.open(db).profile("default")
    worker = MemoryWorker(
        lambda: FactLog.open(db),
        profile_id,
        builder,
        store,
        DeterministicExtractor(),
        w=0,
        batch_size=32,
        poll_seconds=0.2,
    ).start()
    print("started", flush=True)
    worker.wait_idle(timeout=600)
    worker.stop()
    print(f"done {worker.stats.encoded_facts}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
