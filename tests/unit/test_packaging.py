"""What a plain install of the assistant contains: the product, not its benchmarks or tests.

The wheel is built from this checkout (``pip wheel --no-deps``, a few seconds), then checked
file by file; a non-editable install of it is run from an empty folder.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO

BENCH_ONLY = {"matplotlib", "nltk"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("inferscale_assistant-*.whl")
    return path


def test_the_wheel_holds_the_product_and_its_data_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("inferscale_assistant-")}
    assert tops == {"app", "inferscale_core"}  # no bench/, tests/, docs/
    assert "inferscale_core/system_prompt.txt" in names
    assert "app/tui/app.tcss" in names
    assert not [n for n in names if "/bench" in n and not n.endswith("commands/bench.py")]


def test_matplotlib_and_nltk_come_only_with_the_bench_extra(wheel):
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith("dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    for requirement in requires:
        name = requirement.split(";")[0].split("<")[0].split(">")[0].split("=")[0].strip()
        if name in BENCH_ONLY:
            assert 'extra == "bench"' in requirement, requirement


def test_bench_in_a_plain_install_says_how_to_get_it(wheel, tmp_path):
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (target / "bench").exists()
    run = subprocess.run(  # from an empty folder: only the installed copy is importable
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"]
        + ["bench", "ttft"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "pip install -e '.[bench]'" in run.stderr
    assert "Traceback" not in run.stderr


def _third_party_imports(folder: Path) -> set[str]:
    """Top-level modules imported anywhere under ``folder`` that are not the project's or
    the standard library's."""
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    ours = {"app", "inferscale_core", "bench", "tests"}
    return {name for name in found - ours if name not in sys.stdlib_module_names}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).strip().lower()


def test_every_import_of_the_product_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = {
        _normal(req.split(";")[0].split("<")[0].split(">")[0].split("=")[0].split("[")[0])
        for req in project["dependencies"]
        + [r for extra in ("cpu", "gpu", "cuvs", "ray") for r in extras[extra]]
    }
    # What the declared distributions bring along and the product imports by name.
    provided = {"triton"}  # optional: ships with CUDA builds of torch (fused_inject)
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for module in _third_party_imports(REPO / "inferscale_core") | _third_party_imports(
        REPO / "app"
    ):
        names = {_normal(d) for d in dists.get(module, [module])}
        names |= {_normal(f"{n}-cu13") for n in names}  # CUDA builds carry the CUDA version
        if not names & declared and module not in provided:
            missing[module] = sorted(names)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
