"""``memory`` and ``doctor``: the commands that work without the UI, run in-process."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
import torch

from app import cli
from app.commands import chat as chat_cmd
from inferscale_core import paths
from inferscale_core.factlog import FactLog
from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh INFERSCALE_HOME per test, with three memories (one encoded in the KV store)."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")  # Rich tables: long paths on one line
    with FactLog.open(paths.memory_db()) as log:
        pid = log.profile("default")
        cat, _ = log.add_fact(pid, "I adopted a grey cat named Miso", refers_to="2023-05-08")
        log.add_fact(pid, "My sister Ana moved to Lisbon")
        log.add_fact(pid, "I practise the cello every morning")
        store = KVStore(paths.kv_dir() / "fp0")
        shape = (2, 3, 1, 4)  # [layers, tokens, kv_heads, head_dim]
        store.put(FactKV("cat-key", [1, 2, 3], torch.zeros(shape), torch.zeros(shape), "fp0"))
        log.record_kv(cat, "fp0", 2, "v", "cat-key", 3, 96)
    return tmp_path / "home"


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_memory_list(home, capsys):
    code, out = _run(capsys, "memory", "list")
    assert code == 0 and "3 memories" in out and "Miso" in out and "2023-05-08" in out
    code, out = _run(capsys, "memory", "list", "--json")
    cello, _, cat = json.loads(out)  # newest first
    assert cello["text"] == "I practise the cello every morning" and cello["status"] == "active"
    assert cat["refers_to"] == "2023-05-08"
    # `memory search` runs the product's retrieval: tests/unit/test_memory_search_cli.py


def test_memory_forget_removes_text_and_kv(home, capsys):
    store = KVStore(paths.kv_dir() / "fp0")
    assert store.has("cat-key")
    code, out = _run(capsys, "memory", "forget", "1")  # not a terminal, no --yes: refuses
    assert code == 2 and "--yes" in out
    code, out = _run(capsys, "memory", "forget", "1", "--yes")
    assert code == 0 and "forgot #1 (1 KV entry deleted)" in out
    assert not store.has("cat-key")
    with FactLog.open(paths.memory_db()) as log:
        fact = log.get_fact(1)
        assert fact.status == "forgotten" and fact.text == ""
        assert log.audit(fact.profile_id, 1)[-1].action == "forget"
    code, out = _run(capsys, "memory", "forget", "99", "--yes")
    assert code == 1 and "no memory #99" in out


def test_memory_export_writes_private_json(home, tmp_path, capsys):
    target = tmp_path / "facts.json"
    code, _ = _run(capsys, "memory", "export", "-o", str(target))
    assert code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    data = json.loads(target.read_text())
    assert data["profile"] == "default"
    assert [f["text"] for f in data["facts"]][0] == "I adopted a grey cat named Miso"
    assert data["facts"][0]["refers_to"] == "2023-05-08"
    code, out = _run(capsys, "memory", "export")
    assert json.loads(out)["facts"] == data["facts"]


def test_a_bad_config_file_is_explained(home, capsys):
    paths.config_file().write_text("k = -3\n")
    code, out = _run(capsys, "memory", "list")
    assert code == 2 and "k must be a whole number >= 0" in out


def test_doctor_finds_loose_permissions_and_says_how_to_fix(home, capsys):
    code, out = _run(capsys, "doctor", "--skip-engine")
    assert code == 0, out
    for name in ("config", "model", "embedding model", "KV store", "memory", "permissions"):
        assert name in out
    assert "3 active memories" in out
    assert "3 memories not in the search index" in out  # a warning, with the fix
    os.chmod(paths.memory_db(), 0o644)
    os.chmod(paths.data_dir(), 0o755)
    code, out = _run(capsys, "doctor", "--skip-engine")
    assert code == 1
    assert f"chmod 600 {paths.memory_db()}" in out and f"chmod 700 {paths.data_dir()}" in out


@pytest.mark.skipif(
    shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler: nothing is built"
)
def test_doctor_says_how_the_cpu_expands_int4_memories(home, monkeypatch):
    from app.commands.doctor import check_store
    from inferscale_core.kvstore import int4_native

    built = check_store(None, "int4")
    assert built.status == "ok" and "the CPU expands them with the C kernel" in built.detail
    assert "expands" not in check_store(None, "model").detail
    monkeypatch.setattr(int4_native, "_status", "torch (no C compiler (cc) on PATH)")
    monkeypatch.setattr(int4_native, "_kernel", None)
    missing = check_store(None, "int4")
    assert missing.status == "warn" and "torch (no C compiler (cc) on PATH)" in missing.detail
    assert missing.fix.startswith("install a C compiler")
    monkeypatch.setenv(int4_native.ENV, "torch")  # chosen, so nothing to fix
    assert check_store(None, "int4").status == "ok"


def test_doctor_checks_that_the_engine_imports():
    from app.commands.doctor import check_engine

    check = check_engine()
    assert check.status == "ok", check
    assert "vLLM" in check.detail


def test_no_command_opens_the_chat(monkeypatch, home, capsys):
    code, out = _run(capsys)  # not a terminal here
    assert code == 2 and "the chat needs a terminal" in out
    opened = []
    monkeypatch.setattr(chat_cmd, "run_chat", lambda config, verbose: opened.append(config) or 0)
    monkeypatch.setattr(chat_cmd.sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(chat_cmd.sys.stdout, "isatty", lambda: True)
    assert cli.main([]) == 0
    assert opened and opened[0].model is None and opened[0].k == 50


@pytest.mark.parametrize(
    "argv",
    [
        ("chat",),
        ("memory",),
        ("memory", "list"),
        ("memory", "search"),
        ("memory", "forget"),
        ("memory", "export"),
        ("doctor",),
    ],
)
def test_every_new_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    assert "usage: inferscale-assistant" in capsys.readouterr().out


def test_memory_stats_counts_memories_and_the_disk_their_kv_takes(home, capsys, smollm2_path):
    store = KVStore(paths.kv_dir() / "fp1", fingerprint="fp1", store_dtype="int4")
    shape = (2, 5, 1, 64)  # [layers, tokens, kv_heads, head_dim]
    for i in range(3):
        k = torch.randn(shape, generator=torch.Generator().manual_seed(i))
        store.put(FactKV(f"fact-{i}", list(range(5)), k, -k, "fp1"))
    code, out = _run(capsys, "memory", "stats", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["facts"] == 3 and report["kv_store_dtype"] == "auto"
    assert report["writes_as"] == "int4"
    assert report["kv_cache_dtype"] == "auto"
    models = {m["fingerprint"]: m for m in report["models"]}
    assert models["fp0"]["entries"] == 1 and models["fp0"]["by_dtype"]["model"]["entries"] == 1
    int4 = models["fp1"]
    assert int4["entries"] == 3 and int4["by_dtype"] == {
        "int4": {"entries": 3, "disk_bytes": int4["disk_bytes"]}
    }
    on_disk = sum(p.stat().st_size for p in (paths.kv_dir() / "fp1").glob("*.safetensors"))
    assert int4["disk_bytes"] == on_disk and report["disk_bytes"] >= on_disk
    # none of the entries is the model in use's (SmolLM2's): all 3 wait to be encoded for it
    assert report["model_in_use"] and report["encoded_for_model_in_use"] == 0
    code, out = _run(capsys, "memory", "stats")
    assert code == 0 and "3 memories" in out and "int4 3" in out and "model 1" in out
    assert "has KV for 0 of 3 memories; 3 are encoded in the background" in out


def test_doctor_says_how_the_store_keeps_entries(home, capsys):
    code, out = _run(capsys, "doctor", "--skip-engine")
    assert "fp0: 1 entries" in out and "(1 model)" in out and "stored as int4" in out


def test_memory_stats_and_doctor_show_the_budget_and_what_waits(home, capsys):
    paths.config_file().write_text('kv_disk_budget = "1 kB"\n')
    with FactLog.open(paths.memory_db()) as log:
        pid = log.profile("default")
        lisbon = [f.id for f in log.active_facts(pid) if "Lisbon" in f.text]
        assert log.defer_kv(lisbon, "import") == 1
    code, out = _run(capsys, "memory", "stats", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["kv_disk_budget"] == "1 kB"
    assert report["deferred_facts"] == 1 and report["deferred_by_reason"] == {"import": 1}
    (fp0,) = report["models"]
    assert (fp0["recorded_bytes"], fp0["budget_bytes"]) == (96, 1000)
    code, out = _run(capsys, "memory", "stats")
    assert code == 0 and "kv_disk_budget = 1 kB; 1 memory encoded when first" in out
    assert "1000 B" in out  # the budget column
    code, out = _run(capsys, "doctor", "--skip-engine")
    assert "KV budget" in out and "kv_disk_budget = 1 kB (0.00 GiB)" in out
    assert "1 memory encoded when first retrieved (1 import)" in out
    paths.config_file().write_text('kv_disk_budget = "lots"\n')
    code, out = _run(capsys, "memory", "stats")
    assert code == 2 and "kv_disk_budget must be auto, off or a size" in out
