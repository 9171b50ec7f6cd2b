"""Table I/O for `pollux.litz.checkpoint`: PS tables as row blocks in torch.distributed.checkpoint.

Kept apart from the store and its other parts (`checkpoint_folders`: step folders, commit, removal;
`checkpoint_manifest`: manifest and marker; `checkpoint_states`: pickled states) so each stays small.
DCP stores every key at its own offset in one file and reads back only the keys asked for, which is
what makes row-subset loads cheap (SCAR's partial recovery reads about the lost fraction of a checkpoint).
"""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pollux.durable import fsync_dir
from pollux.litz.api import LitzError


class CheckpointError(LitzError):
    """A checkpoint cannot be written or read; the message names the file or field at fault."""


def crc32(data: Any) -> int:
    return zlib.crc32(memoryview(data).cast("B")) & 0xFFFFFFFF


@contextlib.contextmanager
def _dcp_quiet() -> Iterator[None]:
    """DCP warns that it runs without a process group; single-process use is the intent here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _starts(name: str, n: int, given: Any, br: int) -> list[int]:
    """Block start positions: the caller's boundaries (if any), each segment cut every `br` rows."""
    bounds = [0] if n else []
    if given is not None and n:
        bounds = sorted({0, *(int(x) for x in np.asarray(given).reshape(-1))})
        if bounds[0] < 0 or bounds[-1] >= n:
            raise CheckpointError(f"LitzCheckpoint.block_starts[{name!r}]: positions must lie in [0, {n})")
    return [s for a, b in zip(bounds, [*bounds[1:], n], strict=True) for s in range(a, b, br)]


def write_tables(
    tdir: Path,
    tables: Mapping[str, np.ndarray],
    rows: Mapping[str, Any],
    block_starts: Mapping[str, Any],
    block_rows: int | None,
    block_bytes: int,
) -> tuple[dict[str, Any], int, int]:
    """Write `tables` into the DCP folder `tdir` as row blocks; return (layout, bytes, keys).

    Rows keep the caller's order. A block of a partial table stores its global row indices unless
    they are one ascending range; the layout keeps each block's [lo, hi] so a reader skips blocks
    that cannot hold the rows it wants without reading them.
    """
    for what, keys in (("rows", rows), ("block_starts", block_starts)):
        unknown = set(keys) - set(tables)
        if unknown:
            raise CheckpointError(f"LitzCheckpoint.{what}: tables {sorted(unknown)} are not in tables")
    if not tables:
        return {}, 0, 0
    import torch

    sd: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for i, (name, value) in enumerate(tables.items()):
        if not isinstance(value, np.ndarray) or value.ndim < 1:
            raise CheckpointError(f"LitzCheckpoint.tables[{name!r}]: need a numpy array, rows first")
        arr = np.ascontiguousarray(value)
        n = arr.shape[0]
        grows = rows.get(name)
        if grows is not None:
            grows = np.asarray(grows, dtype=np.int64).reshape(-1)
            if grows.shape[0] != n:
                raise CheckpointError(
                    f"LitzCheckpoint.rows[{name!r}]: {grows.shape[0]} indices for {n} table rows"
                )
            if n and grows.min() < 0:
                raise CheckpointError(f"LitzCheckpoint.rows[{name!r}]: negative row index")
            if np.unique(grows).shape[0] != n:
                raise CheckpointError(f"LitzCheckpoint.rows[{name!r}]: duplicate row indices")
        try:
            torch.from_numpy(arr[:0])
        except TypeError as exc:
            raise CheckpointError(
                f"LitzCheckpoint.tables[{name!r}]: dtype {arr.dtype} cannot be stored ({exc})"
            ) from exc
        row_bytes = max(1, arr[:1].nbytes if n else arr.itemsize)
        starts = _starts(name, n, block_starts.get(name), block_rows or max(1, block_bytes // row_bytes))
        blocks = []
        for j, (start, stop) in enumerate(zip(starts, [*starts[1:], n], strict=True)):
            key = f"t{i}/b{j}"
            block = arr[start:stop]
            sd[key] = torch.from_numpy(block)
            lo, hi, rows_key, rows_crc = start, stop - 1, None, None
            if grows is not None:
                rb = np.ascontiguousarray(grows[start:stop])
                lo, hi = int(rb.min()), int(rb.max())
                if not (rb[0] == lo and hi - lo == stop - start - 1 and bool(np.all(np.diff(rb) == 1))):
                    rows_key = f"{key}/rows"
                    sd[rows_key] = torch.from_numpy(rb)
                    rows_crc = crc32(rb)
            blocks.append(
                {"key": key, "start": start, "stop": stop, "lo": lo, "hi": hi, "crc": crc32(block),
                 "rows_key": rows_key, "rows_crc": rows_crc}
            )  # fmt: skip
        out[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "partial": grows is not None,
                     "blocks": blocks}  # fmt: skip
    if not sd:
        return out, 0, 0
    import torch.distributed.checkpoint as dcp

    with _dcp_quiet():
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(tdir, sync_files=True), no_dist=True)
    fsync_dir(tdir)
    nbytes = sum(p.stat().st_size for p in tdir.iterdir() if p.is_file())
    return out, nbytes, len(sd)


def _dcp_load(tdir: Path, sd: dict[str, Any]) -> int:
    """Fill the tensors of `sd` in place from `tdir`; DCP reads only these keys. Returns bytes read."""
    if not sd:
        return 0
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(tdir)
    try:
        with _dcp_quiet():
            dcp.load(sd, storage_reader=reader, no_dist=True)
    except Exception as exc:
        raise CheckpointError(f"{tdir}: cannot read table blocks ({type(exc).__name__}: {exc})") from exc
    nbytes = sum(info.length for index, info in reader.storage_data.items() if index.fqn in sd)
    with contextlib.suppress(OSError):
        nbytes += (tdir / ".metadata").stat().st_size
    return nbytes


def read_tables(
    tdir: Path,
    layout: Mapping[str, Any],
    names: list[str],
    rows: Mapping[str, np.ndarray],
    strict: bool,
    out_tables: dict[str, np.ndarray],
    out_rows: dict[str, np.ndarray],
) -> tuple[int, int]:
    """Read tables `names` into `out_tables` (and `out_rows`); return (bytes read, keys read).

    Whole reads take one DCP pass. Row queries take two: the row indices of the blocks whose
    [lo, hi] range can hold a wanted row, then the values of only the blocks that do hold one.
    """
    if not names:
        return 0, 0
    import torch

    sd: dict[str, Any] = {}
    index_sd: dict[str, Any] = {}
    whole: list[tuple[str, np.ndarray, list[dict[str, Any]], bool]] = []
    queries: list[
        tuple[str, np.ndarray, list[dict[str, Any]], np.ndarray, np.dtype[Any], tuple[int, ...]]
    ] = []
    for name in names:
        md = layout[name]
        dtype, shape = np.dtype(md["dtype"]), tuple(md["shape"])
        blocks = md["blocks"]
        if name not in rows:
            arr = np.empty(shape, dtype=dtype)
            for b in blocks:
                sd[b["key"]] = torch.from_numpy(arr[b["start"] : b["stop"]])
                if b["rows_key"]:
                    sd[b["rows_key"]] = torch.from_numpy(np.empty(b["stop"] - b["start"], np.int64))
            whole.append((name, arr, blocks, md["partial"]))
            continue
        want = np.asarray(rows[name], dtype=np.int64).reshape(-1)
        ws = np.sort(want)
        lo = np.array([b["lo"] for b in blocks], dtype=np.int64)
        hi = np.array([b["hi"] for b in blocks], dtype=np.int64)
        cand = np.flatnonzero(np.searchsorted(ws, hi, "right") > np.searchsorted(ws, lo, "left"))
        for j in cand.tolist():
            b = blocks[j]
            if b["rows_key"]:
                index_sd[b["rows_key"]] = torch.from_numpy(np.empty(b["stop"] - b["start"], np.int64))
        queries.append((name, want, blocks, cand, dtype, shape))
    nbytes = _dcp_load(tdir, index_sd)
    gathers = []
    for name, want, blocks, cand, dtype, shape in queries:
        owner = np.full(want.shape, -1, dtype=np.int64)
        pos = np.full(want.shape, -1, dtype=np.int64)
        for j in cand.tolist():
            b = blocks[j]
            if b["rows_key"]:
                brows = index_sd[b["rows_key"]].numpy()
                if crc32(brows) != b["rows_crc"]:
                    raise CheckpointError(f"{tdir}: table {name!r} rows {b['rows_key']} fail their CRC")
                order = np.argsort(brows, kind="stable")
                p = np.minimum(np.searchsorted(brows[order], want), len(brows) - 1)
                hit = brows[order[p]] == want
                pos[hit], owner[hit] = order[p[hit]], j
            else:
                hit = (want >= b["lo"]) & (want <= b["hi"])
                pos[hit], owner[hit] = want[hit] - b["lo"], j
        found = owner >= 0
        if strict and not bool(found.all()):
            missing = want[~found][:5].tolist()
            raise CheckpointError(f"{tdir.parent}: table {name!r} lacks rows {missing}…")
        bufs = {}
        for j in np.unique(owner[found]).tolist():
            b = blocks[j]
            bufs[j] = np.empty((b["stop"] - b["start"], *shape[1:]), dtype=dtype)
            sd[b["key"]] = torch.from_numpy(bufs[j])
        gathers.append((name, want, blocks, owner, pos, found, bufs, dtype, shape))
    nbytes += _dcp_load(tdir, sd)
    for name, arr, blocks, partial in whole:
        grows = np.empty(arr.shape[0], np.int64)
        for b in blocks:
            _check_block(tdir, name, b, arr[b["start"] : b["stop"]], sd)
            grows[b["start"] : b["stop"]] = (
                sd[b["rows_key"]].numpy() if b["rows_key"] else np.arange(b["lo"], b["hi"] + 1)
            )
        out_tables[name] = arr
        if partial:
            out_rows[name] = grows
    for name, want, blocks, owner, pos, found, bufs, dtype, shape in gathers:
        vals = np.empty((int(found.sum()), *shape[1:]), dtype=dtype)
        for j, buf in bufs.items():
            _check_block(tdir, name, blocks[j], buf, sd)
            sel = owner == j
            vals[sel[found]] = buf[pos[sel]]
        out_tables[name] = vals
        out_rows[name] = want[found]
    return nbytes, len(sd) + len(index_sd)


def _check_block(
    tdir: Path, name: str, b: Mapping[str, Any], values: np.ndarray, sd: Mapping[str, Any]
) -> None:
    if crc32(np.ascontiguousarray(values)) != b["crc"]:
        raise CheckpointError(f"{tdir}: table {name!r} block {b['key']} fails its CRC (corrupt)")
    if b["rows_key"] and b["rows_key"] in sd and crc32(sd[b["rows_key"]].numpy()) != b["rows_crc"]:
        raise CheckpointError(f"{tdir}: table {name!r} rows {b['rows_key']} fail their CRC")
