"""The command line as a user runs it (a separate process: it starts its own engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
    )


def test_help_explains_every_command():
    done = _cli("--help")
    assert done.returncode == 0
    for word in ("ask", "bench", "models", "Nothing leaves this machine"):
        assert word in done.stdout
    for sub in (("ask",), ("bench", "ttft"), ("models", "prepare")):
        assert _cli(*sub, "--help").returncode == 0


def test_the_shell_doors_load_no_engine_code():
    """`ask` through a running assistant, `--help`, `daemon`/`mcp`'s parsing: none imports
    torch or vLLM (3.6 s of imports before; the resident path's budget is about a second)."""
    probe = (
        "import sys, app.cli, app.resident, app.commands.ask as ask;"
        " app.cli.build_parser();"
        " ask._report({'text': '', 'ttft_s': None, 'facts': [], 'mode': 'inject',"
        " 'refused': None, 'notes': [], 'conversation_id': None, 'injected_tokens': 0,"
        " 'prompt_tokens': 0, 'prefix_cached_tokens': 0, 'computed_tokens': 0}, None);"
        " print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    for sub, word in (("daemon", "private socket"), ("mcp", "search_memory")):
        assert word in _cli(sub, "--help").stdout.replace("\n", " ")


def test_bad_arguments_get_a_clear_error():
    done = _cli("bench", "ttft", "--k", "5,x")
    assert done.returncode == 2
    assert "--k takes comma-separated whole numbers" in done.stderr


def test_missing_model_folder_is_explained(tmp_path):
    done = _cli("ask", "--model", str(tmp_path / "nope"), "hi")
    assert done.returncode == 2
    assert "does not exist" in done.stderr


@pytest.mark.engine
def test_ask_json_reports_answer_ttft_and_injected_facts(smollm2_path):
    done = _cli(
        "ask",
        "--json",
        "--fact",
        "2023-05-08 I adopted a grey cat named Miso from the shelter.",
        "What is the name of my cat?",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report) >= {"answer", "ttft_s", "injected_fact_ids", "injected_tokens"}
    assert report["answer"]
    assert report["ttft_s"] > 0
    assert len(report["injected_fact_ids"]) == 1
    assert report["injected_tokens"] > 0
    assert report["refused"] is None
