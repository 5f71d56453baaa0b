"""Where the assistant keeps its files: every folder it makes is private (0700)."""

from __future__ import annotations

import os
import stat

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
