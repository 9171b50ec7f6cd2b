"""Reading the simulator's CSV inputs (profiles, workloads, traces) with errors that say where.

One reader for every CSV file the simulator takes, so that each gets the same checks: the file
exists, is UTF-8 text (a byte-order mark is accepted), has a header with the required columns, and
every non-blank row has as many fields as the header. Line numbers are those of the file (blank
lines and quoted newlines counted), and ``loc(line)`` formats them in the caller's style
(``"file, line 3"`` for profiles, ``"file:3"`` for workloads and traces).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["read_rows"]


def read_rows(path: Path, columns: Sequence[str], *, kind: str, loc: Callable[[int], str],
              missing_message: str | None = None,
              empty_message: str = "no data rows") -> tuple[dict[str, int], list[tuple[int, list[str]]]]:
    """``({column: index}, [(line, fields), ...])`` of a header-checked CSV file.

    ``kind`` names the file in the not-found error (``FileNotFoundError``: "no such <kind> file",
    or ``missing_message`` if given); every other problem is a ValueError naming the file and line.
    A file with a header and no data row raises ``f"{path}: {empty_message}"``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {missing_message or f'no such {kind} file'}")
    rows: list[tuple[int, list[str]]] = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader, None)
                if header is None:
                    raise ValueError(f"{path}: empty file, expected header {','.join(columns)}")
                header = [h.strip() for h in header]
                missing = [c for c in columns if c not in header]
                if missing:
                    raise ValueError(f"{loc(1)}: missing column(s) {', '.join(missing)}")
                for fields in reader:
                    if not any(x.strip() for x in fields):
                        continue
                    if len(fields) != len(header):
                        raise ValueError(f"{loc(reader.line_num)}: expected {len(header)} fields, "
                                         f"got {len(fields)}")
                    rows.append((reader.line_num, fields))
            except csv.Error as exc:
                raise ValueError(f"{loc(reader.line_num)}: malformed CSV: {exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if not rows:
        raise ValueError(f"{path}: {empty_message}")
    return {c: header.index(c) for c in columns}, rows
