"""Big JSON exports are streamed: memory stays at about one conversation, not the file."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from inferscale_core.importers import parse_file


def _write_export(path: Path, conversations: int, nodes: int, words: int) -> None:
    """A ChatGPT export of linear threads, written piece by piece."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("[")
        for c in range(conversations):
            mapping: dict[str, dict] = {}
            parent = None
            for n in range(nodes):
                node_id = f"c{c}-n{n}"
                mapping[node_id] = {
                    "id": node_id,
                    "message": {
                        "id": node_id,
                        "author": {"role": "user" if n % 2 else "assistant", "metadata": {}},
                        "create_time": 1_700_000_000.0 + c * 1000 + n,
                        "content": {"content_type": "text", "parts": [f"word{n} " * words]},
                        "weight": 1.0,
                        "metadata": {"model_slug": "gpt-4o", "citations": []},
                        "recipient": "all",
                    },
                    "parent": parent,
                    "children": [],
                }
                if parent:
                    mapping[parent]["children"].append(node_id)
                parent = node_id
            conv = {"title": f"t{c}", "mapping": mapping, "current_node": parent, "id": f"c{c}"}
            f.write(("," if c else "") + json.dumps(conv))
        f.write("]")


def test_chatgpt_export_streams_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    _write_export(path, conversations=150, nodes=40, words=150)  # ~8 MB, ~50 KB each
    size = path.stat().st_size
    assert size > 7_000_000
    tracemalloc.start()
    try:
        count = turns = 0
        for conv in parse_file(path):
            count += 1
            turns += len(conv.turns)
            del conv
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (count, turns) == (150, 150 * 40)
    # a whole-file json.load would hold far more than the file size as Python objects
    assert peak < size / 5, f"peak {peak:,} bytes for a {size:,}-byte file"
