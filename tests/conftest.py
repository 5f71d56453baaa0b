"""Shared fixtures.

Each test session keeps its data (fact log, KV store) in a fresh temporary ``INFERSCALE_HOME``
unless the environment sets one. The dequantized SmolLM2 (~540 MB, ~15 s to build) lives in the
model cache, which is shared with the user's (``packaging/dev.sh`` prepares it) unless
``INFERSCALE_CACHE`` says otherwise. One vLLM engine serves the whole session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# No test may reach a model hub or send usage statistics, whatever the caller's environment says.
for _name in (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
):
    os.environ[_name] = "1"

# Under xdist (``-n N``) each worker's engines keep to cores of their own (worker i: every N-th
# CPU from the i-th), the ones it starts in other processes too: two engines' OpenMP threads
# never share a core (where they do, each waits on the other at every barrier). Torch outside
# the engine (the Hugging Face oracle) keeps to as many threads.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKER and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    _cpus = sorted(os.sched_getaffinity(0))
    if 1 < _WORKERS <= len(_cpus):
        _share = _cpus[int(_WORKER.removeprefix("gw")) % _WORKERS :: _WORKERS]
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, _share))
        os.environ.setdefault("OMP_NUM_THREADS", str(len(_share)))


@pytest.hookimpl(tryfirst=True)  # before pytest makes the tmp_path factory
def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker's temporary folders go in ``<basetemp>/gw0``, not xdist's
    ``<basetemp>/popen-gw0``: the Unix sockets the tests make under their tmp_path (a desk's,
    in its home's ``run/``) must fit in 107 bytes, as they do without xdist."""
    given = getattr(config.option, "basetemp", None)
    if _WORKER and given and Path(given).name == f"popen-{_WORKER}":
        config.option.basetemp = str(Path(given).with_name(_WORKER))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n 2 --dist loadgroup`` (what ``packaging/dev.sh test`` runs), each worker is a
    session of its own: the tests on the session's engine all go to one worker (one in-process
    engine, not one a worker), and serve's to one (its package-scoped servers start once; the
    Ray deployment's module, with a server of its own, is a group apart). The rest (pure
    logic, and the checks that start an engine in a process of their own) is spread over
    both. Without xdist the mark does nothing."""
    for item in items:
        if "runtime" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("runtime"))
        elif item.nodeid.startswith("tests/serve/test_serve_ray.py"):
            item.add_marker(pytest.mark.xdist_group("ray"))  # its own server: either worker
        elif item.nodeid.startswith("tests/serve/"):
            item.add_marker(pytest.mark.xdist_group("serve"))


@pytest.fixture(scope="session", autouse=True)
def inferscale_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's ``INFERSCALE_HOME``: the environment's if set, else a temporary folder."""
    existing = os.environ.get("INFERSCALE_HOME")
    if existing:
        yield Path(existing)
        return
    from inferscale_core import paths

    os.environ.setdefault(paths.CACHE_ENV, str(paths.cache_dir()))  # before the home moves
    home = tmp_path_factory.mktemp("inferscale-home")
    os.environ["INFERSCALE_HOME"] = str(home)
    try:
        yield home
    finally:
        os.environ.pop("INFERSCALE_HOME", None)


@pytest.fixture(scope="session")
def smollm2_path(inferscale_home: Path) -> Path:
    """The dequantized SmolLM2-135M-Instruct folder, built once (or reused from the cache)."""
    from inferscale_core.model_files import smollm2_dir

    return smollm2_dir(progress=True)


@pytest.fixture(scope="session")
def runtime(smollm2_path: Path, inferscale_home: Path):
    """The real vllm-cpu engine on SmolLM2 with our connector; one per session."""
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig

    # Entries in the model's dtype: the exactness tests compare them with a full prefill (the
    # compressed ones have tests of their own, and the app's default is exercised by the TUI
    # and serve tests).
    config = AppConfig(kv_store_dtype="model")
    return wiring.build(config, store_root=inferscale_home / "test-kv", max_model_len=4096)


@pytest.fixture(scope="session")
def hf_oracle(runtime):
    """The oracle: a Hugging Face copy of the same model (fp32, eager attention), tests only."""
    from tests.support.hf_encoder import HFReferenceEncoder

    return HFReferenceEncoder(runtime.model_dir, runtime.fingerprint)


@pytest.fixture(scope="session")
def hf_model(hf_oracle):
    """The oracle's model (the engine's weights, in Hugging Face's implementation)."""
    return hf_oracle.model


@pytest.fixture(scope="session")
def minilm():
    """The packaged MiniLM embedder, loaded once for the session (a few seconds a load on
    the 2-core machine): sessions only read it, and one lock serialises its threads."""
    from inferscale_core.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.fixture
def log(tmp_path: Path):
    """A fact log in a real SQLite file of the test's own, closed afterwards."""
    from inferscale_core.factlog import FactLog

    with FactLog.open(tmp_path / "memory.db") as factlog:
        yield factlog
