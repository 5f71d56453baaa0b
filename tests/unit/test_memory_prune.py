"""``memory prune --model``: another model's KV entries go (files and rows), facts stay.

Real SQLite files and real entry files written through :class:`KVStore`; the model in use is a
config-only Llama folder (its fingerprint needs no weights).
"""

from __future__ import annotations

import json

import pytest
import torch

from app import cli
from inferscale_core import paths
from inferscale_core.factlog import FactLog
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "head_dim": 16,
}


def _model(folder, layers: int):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": layers}))
    return folder


def _encode(log: FactLog, fact_ids: list[int], fingerprint: str) -> KVStore:
    """One entry per fact in ``fingerprint``'s store, recorded as the worker records them."""
    store = KVStore(paths.kv_dir() / fingerprint, fingerprint=fingerprint)
    shape = (2, 3, 1, 4)  # [layers, tokens, kv_heads, head_dim]
    for fid in fact_ids:
        key = f"{fingerprint}-{fid}"
        path = store.put(FactKV(key, [1, 2, 3], torch.ones(shape), -torch.ones(shape), fingerprint))
        log.record_kv(fid, fingerprint, 2, "v", key, 3, path.stat().st_size)
    return store


@pytest.fixture
def home(tmp_path, monkeypatch):
    """In use: model "current"; encoded for it and for "old" (two profiles)."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")
    current = _model(tmp_path / "current", 2)
    old = _model(tmp_path / "old", 3)
    paths.config_file().write_text(f'model = "{current}"\n')
    with FactLog.open(paths.memory_db()) as log:
        pid, other = log.profile("default"), log.profile("work")
        ids = [log.add_fact(pid, f"I own {n} bicycles")[0] for n in range(3)]
        ids.append(log.add_fact(other, "The office is on the fourth floor")[0])
        _encode(log, ids, model_fingerprint(current))
        _encode(log, ids, model_fingerprint(old))
    return {"current": current, "old": old}


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _rows(fingerprint: str) -> int:
    with FactLog.open(paths.memory_db()) as log:
        return log.kv_rows(fingerprint)[0]


def test_prune_drops_another_models_files_and_rows_only(home, capsys):
    old, current = model_fingerprint(home["old"]), model_fingerprint(home["current"])
    on_disk = sum(p.stat().st_size for p in (paths.kv_dir() / old).iterdir())
    code, out = _run(capsys, "memory", "prune", "--model", old)  # not a terminal, no --yes
    assert code == 2 and "--yes" in out and _rows(old) == 4
    code, out = _run(capsys, "memory", "prune", "--model", old, "--dry-run")
    assert code == 0 and "dry run: nothing deleted" in out and _rows(old) == 4
    assert "4" in out  # entries and rows in the plan
    code, out = _run(capsys, "memory", "prune", "--model", old, "--yes")
    assert code == 0, out
    assert f"pruned {old}: 4 KV entries deleted" in out and "(4 recorded keys dropped)" in out
    from inferscale_core.footprint import size_text

    assert f"{size_text(on_disk)} freed" in out
    assert _rows(old) == 0 and not (paths.kv_dir() / old).exists()
    assert _rows(current) == 4  # the model in use keeps everything
    assert len(KVStore(paths.kv_dir() / current).keys()) == 4
    with FactLog.open(paths.memory_db()) as log:  # facts are never touched
        assert len(log.active_facts(log.profile("default"))) == 3
        assert len(log.active_facts(log.profile("work"))) == 1


def test_prune_by_model_folder(home, capsys):
    old = model_fingerprint(home["old"])
    code, out = _run(capsys, "memory", "prune", "--model", str(home["old"]), "--yes")
    assert code == 0 and f"pruned {old}: 4 KV entries deleted" in out
    assert _rows(old) == 0 and _rows(model_fingerprint(home["current"])) == 4


def test_the_model_in_use_is_refused(home, capsys):
    current = model_fingerprint(home["current"])
    for name in (current, str(home["current"])):
        code, out = _run(capsys, "memory", "prune", "--model", name, "--yes")
        assert code == 2 and "is the model in use" in out and current in out
    assert _rows(current) == 4 and len(KVStore(paths.kv_dir() / current).keys()) == 4


def test_a_fingerprint_with_no_entries_says_so(home, capsys):
    code, out = _run(capsys, "memory", "prune", "--model", "0123456789abcdef", "--yes")
    assert code == 0 and "no KV entries for 0123456789abcdef" in out
    assert "nothing to prune" in out and model_fingerprint(home["old"]) in out  # what there is
    code, out = _run(capsys, "memory", "prune", "--model", "no-such-model", "--yes")
    assert code == 2 and "does not exist" in out


def test_unrecorded_files_and_rows_without_files_go_too(home, capsys):
    """A crash between rows and files, or a file the log never named: both are pruned."""
    old = model_fingerprint(home["old"])
    store = KVStore(paths.kv_dir() / old, fingerprint=old)
    shape = (2, 3, 1, 4)
    store.put(FactKV("stray", [1, 2, 3], torch.ones(shape), torch.ones(shape), old))
    store.delete(f"{old}-1")  # its row stays
    code, out = _run(capsys, "memory", "prune", "--model", old, "--yes")
    assert code == 0 and f"pruned {old}: 4 KV entries deleted" in out
    assert "(4 recorded keys dropped)" in out and _rows(old) == 0
