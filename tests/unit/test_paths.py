"""Where the assistant keeps its files: every folder it makes is private (0700)."""

from __future__ import annotations

import os
import stat

import pytest

from inferscale_core import paths


def test_every_folder_made_is_0700_whatever_the_umask(tmp_path, monkeypatch):
    home = tmp_path / "home" / "assistant"  # neither exists yet
    monkeypatch.setenv(paths.HOME_ENV, str(home))
    old = os.umask(0o022)  # the usual one: mkdir(parents=True) made the parents 0755
    try:
        kv = paths.kv_dir()
    finally:
        os.umask(old)
    for folder in (tmp_path / "home", home, home / "data", kv):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_the_socket_folder_is_private_and_never_a_shared_tmp_one(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    # no session runtime folder: under the private data folder, not /tmp/runtime-UID
    assert paths.runtime_dir() == paths.data_dir() / "run"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    (tmp_path / "xdg").mkdir(mode=0o700)
    run = paths.runtime_dir()
    assert run == tmp_path / "xdg" / paths.APP_NAME
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    run.chmod(0o755)  # made readable by others (by hand, or by someone else first)
    with pytest.raises(PermissionError, match="yours alone"):
        paths.runtime_dir()
