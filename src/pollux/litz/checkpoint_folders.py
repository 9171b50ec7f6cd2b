"""The folders of a Litz checkpoint directory: the names on disk, which steps are committed, their moves.

Kept apart from `pollux.litz.checkpoint` because every part of the store must agree on these names
and on the one rule they encode: a step exists only as ``step-<n>`` holding its commit marker. A save
builds a hidden ``.tmp-<pid>-…`` folder and renames it into place; a removal renames a step to a hidden
``.trash-…`` folder before deleting it. So the save, the pruning of old steps, `clear`, and a later
process cleaning up after a crash all tell a committed step from a save in progress (its process is
alive) and from leftovers (its process is gone) by the name alone. What goes *inside* a step folder is
written by `checkpoint_manifest`, `checkpoint_states` and `checkpoint_tables`, under the file names
defined here.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from pollux.durable import fsync_dir

__all__ = ["MANIFEST", "MARKER", "STATES", "STEP_PREFIX", "TENSORS", "StepFolders"]

STEP_PREFIX = "step-"
MARKER = "COMMITTED"
MANIFEST = "manifest.json"
STATES = "states.bin"
TENSORS = "tensors"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StepFolders:
    """The step folders under `directory` (created if missing): naming, listing, commit and removal.

    Every change to the directory is a ``rename`` (atomic) followed, for a commit, by an fsync of the
    directory, so a crash at any moment leaves each step either complete or absent.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, step: int) -> Path:
        """The folder of step `step`; the step is zero-padded so that names sort by step."""
        return self.directory / f"{STEP_PREFIX}{int(step):010d}"

    def steps(self) -> list[int]:
        """Committed steps (folder renamed into place, marker present), oldest first."""
        out = []
        for entry in self.directory.iterdir():
            name = entry.name
            if not name.startswith(STEP_PREFIX):
                continue
            try:
                step = int(name[len(STEP_PREFIX) :])
            except ValueError:
                continue
            if (entry / MARKER).is_file():
                out.append(step)
        return sorted(out)

    def new_temp(self) -> Path:
        """A fresh hidden folder for a save in progress, named after this process so that
        `clean_stale` can tell a live save from the leftovers of a dead one."""
        tmp = self.directory / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, step: int) -> Path:
        """Rename the complete folder `tmp` into place as step `step` and fsync the directory.

        A step that exists is replaced: it is moved away first, so a crash in between leaves the
        older steps and never a mix of the old and the new folder.
        """
        final = self.path(step)
        if final.exists():
            trash = self._trash_path()
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        fsync_dir(self.directory)
        return final

    def discard(self, tmp: Path) -> None:
        """Remove the temp folder of a save that failed (it was never renamed into place)."""
        shutil.rmtree(tmp, ignore_errors=True)

    def drop(self, steps: list[int]) -> None:
        """Remove `steps`, each renamed away before it is deleted (a crash leaves no half step)."""
        for step in steps:
            trash = self._trash_path()
            try:
                os.rename(self.path(step), trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash, ignore_errors=True)

    def clean_stale(self) -> None:
        """Remove temp folders of saves whose process is gone, and leftovers of interrupted prunes."""
        for entry in self.directory.iterdir():
            name = entry.name
            if name.startswith(_TRASH_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
            elif name.startswith(_TMP_PREFIX):
                pid = name[len(_TMP_PREFIX) :].split("-")[0]
                if not pid.isdigit() or (int(pid) != os.getpid() and not _pid_alive(int(pid))):
                    shutil.rmtree(entry, ignore_errors=True)

    def _trash_path(self) -> Path:
        return self.directory / f"{_TRASH_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
