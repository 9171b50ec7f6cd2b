"""`pollux.durable`: the write-and-fsync steps the agent, Litz and SCAR share for their checkpoints."""

from __future__ import annotations

import os

import pytest

from pollux import durable


def test_write_durable_takes_bytes_or_a_writer_and_fsyncs_the_file(tmp_path, monkeypatch):
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", counting_fsync)
    durable.write_durable(tmp_path / "a.bin", b"abc")
    durable.write_durable(tmp_path / "b.bin", lambda f: f.write(b"streamed"))
    assert (tmp_path / "a.bin").read_bytes() == b"abc"
    assert (tmp_path / "b.bin").read_bytes() == b"streamed"
    assert len(synced) == 2
    durable.fsync_dir(tmp_path)
    assert len(synced) == 3


def test_fsync_dir_names_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="gone"):
        durable.fsync_dir(tmp_path / "gone")
