"""Backup and restore: the whole memory in one file, and back.

* ``sealed``: the file's envelope: header, then the payload in 1 MiB chunks, each
  authenticated (and with a passphrase encrypted: scrypt + AES-256-GCM);
* ``snapshot``: a consistent copy of a live SQLite database (the online backup API), and the
  checks a restore runs (``integrity_check``, row counts);
* ``manifest``: what to back up (:class:`Member`) and what was (:class:`Manifest`);
* ``archive``: :func:`write_backup`, written whole or not at all;
* ``restore``: :func:`restore_backup`, unpacked beside the targets, checked, swapped in.

The members (which files, where) are the caller's: ``app/commands/backup.py`` lists the
assistant's. Imports from the project only :mod:`inferscale_core.files` and the fact log.
"""

from inferscale_core.backup.archive import write_backup
from inferscale_core.backup.manifest import Manifest, Member
from inferscale_core.backup.restore import HomeNotEmptyError, RestoreReport, restore_backup
from inferscale_core.backup.sealed import (
    FORMAT_VERSION,
    BackupError,
    DamagedBackupError,
    NewerFormatError,
    NotABackupError,
    PassphraseNeededError,
    WrongPassphraseError,
)

__all__ = [
    "FORMAT_VERSION",
    "BackupError",
    "DamagedBackupError",
    "HomeNotEmptyError",
    "Manifest",
    "Member",
    "NewerFormatError",
    "NotABackupError",
    "PassphraseNeededError",
    "RestoreReport",
    "WrongPassphraseError",
    "restore_backup",
    "write_backup",
]
