"""Where a study is kept: Optuna's RDB storage, by default an SQLite file beside the driver.

The driver and every trial open the same URL: the driver to ask and tell, the trials to write their
intermediate values (:mod:`pollux.hpo.trial_report`). So the storage must be reachable from the
nodes the trials run on — on the embedded cluster the local file is; on a real cluster put the SQLite
file on a file system every node mounts at the same path, or give any database URL Optuna supports
(``postgresql://user:password@host/db``, ``mysql+pymysql://...``). The URL travels to the trials in
their environment (``HPO_STORAGE``), credentials included: they need them to write.

A plain path (no ``://``) means an SQLite file, and a relative SQLite path is made absolute against
the driver's folder: the trials run in their own working folder, where the same relative path would
name another file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.storages import RDBStorage

__all__ = ["DEFAULT_STORAGE", "SQLITE_TIMEOUT_S", "open_storage", "storage_url"]

#: The default storage: this file in the driver's current folder.
DEFAULT_STORAGE = "pollux-hpo.db"
#: How long an SQLite writer waits for another's lock before failing: the driver and K trials write
#: the same file, each briefly, so waiting a little beats failing at once (SQLite's default is 5 s).
SQLITE_TIMEOUT_S = 30.0
SQLITE_PREFIX = "sqlite:///"


def storage_url(value: str | os.PathLike[str], cwd: Path | None = None) -> str:
    """The storage URL for ``--storage``: a path becomes ``sqlite:///<absolute path>``; an SQLite URL
    with a relative path is made absolute; any other URL is kept as it is."""
    text = os.fspath(value)
    base = Path(cwd) if cwd is not None else Path.cwd()
    if "://" not in text:
        return SQLITE_PREFIX + str((base / Path(text).expanduser()).resolve())
    if text.startswith(SQLITE_PREFIX):
        path = text[len(SQLITE_PREFIX):]
        if path and not path.startswith("/") and not path.startswith(":memory:"):
            return SQLITE_PREFIX + str((base / path).resolve())
    return text


def open_storage(url: str) -> RDBStorage:
    """Optuna's RDB storage at ``url`` (tables created if new); SQLite waits for locks."""
    from optuna.storages import RDBStorage

    engine_kwargs = {}
    if url.startswith("sqlite:"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
    return RDBStorage(url, engine_kwargs=engine_kwargs)
