"""The manifest and commit marker of a Litz checkpoint step: written last, checked first.

The manifest is the step's table of contents: the table layout with every block's CRC-32 (from
`checkpoint_tables`) and the pickled state segments with theirs (from `checkpoint_states`). The marker
``COMMITTED``, written after the manifest and holding the manifest's CRC-32, is what makes a folder a
committed step. Kept apart from the store so that the order of these writes and fsyncs, which the
crash safety of a save rests on, is spelled once, and so that a reader verifies the pair before it
touches any data: a torn or foreign folder is refused with its file named, never half read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pollux.durable import fsync_dir, write_durable
from pollux.litz.checkpoint_folders import MANIFEST, MARKER
from pollux.litz.checkpoint_tables import CheckpointError, crc32

__all__ = ["FORMAT", "read_manifest", "write_manifest"]

FORMAT = "pollux-litz-checkpoint/1"


def write_manifest(folder: Path, step: int, tables: dict[str, Any], segments: dict[str, list[int]]) -> int:
    """Write the manifest of `step` into `folder`, then its commit marker; return the bytes written.

    Call it once the tables and states are written and fsynced. The folder is fsynced before the
    marker is written and again after it, so the marker never exists on disk without the manifest.
    """
    manifest = {
        "format": FORMAT,
        "step": int(step),
        "created_unix": time.time(),
        "tables": tables,
        "segments": segments,
    }
    mbytes = json.dumps(manifest, sort_keys=True).encode()
    write_durable(folder / MANIFEST, mbytes)
    marker = json.dumps({"step": int(step), "manifest_crc32": crc32(mbytes)}).encode()
    fsync_dir(folder)
    write_durable(folder / MARKER, marker)
    fsync_dir(folder)
    return len(mbytes) + len(marker)


def read_manifest(folder: Path) -> tuple[dict[str, Any], int]:
    """The verified manifest of the step in `folder`, and the bytes read (manifest and marker).

    Raises `CheckpointError` naming the file when the marker is missing or unreadable, the manifest
    does not match the marker's CRC-32, or the format is not this one.
    """
    mpath, kpath = folder / MANIFEST, folder / MARKER
    try:
        marker = json.loads(kpath.read_bytes())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{kpath}: no commit marker; checkpoint missing or incomplete") from exc
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{kpath}: unreadable commit marker ({exc})") from exc
    try:
        mbytes = mpath.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{mpath}: cannot read manifest ({exc})") from exc
    if not isinstance(marker, dict) or marker.get("manifest_crc32") != crc32(mbytes):
        raise CheckpointError(f"{mpath}: manifest does not match its commit marker (corrupt)")
    manifest = json.loads(mbytes)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mpath}: unknown format {manifest.get('format')!r}")
    return manifest, len(mbytes) + kpath.stat().st_size
