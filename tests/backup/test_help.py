"""``backup --help`` and ``restore --help`` say what is in the file, how it is protected and
what a restore does."""

from __future__ import annotations

import pytest

from app.cli import build_parser


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*args, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_backup_help_says_what_is_in_the_file(capsys: pytest.CaptureFixture[str]):
    text = _help(capsys, "backup")
    for words in (
        "online backup API",
        "config.toml",
        "models.json",
        "users.db",
        "--with-kv",
        "AES-256-GCM",
        "scrypt",
        "--passphrase-file",
        "INFERSCALE_BACKUP_PASSPHRASE",
        "never leaves a partial FILE",
    ):
        assert words in text, words


def test_restore_help_says_what_restore_does(capsys: pytest.CaptureFixture[str]):
    text = _help(capsys, "restore")
    for words in ("integrity_check", "SHA-256", "--force", "before-restore", "memory worker"):
        assert words in text, words
