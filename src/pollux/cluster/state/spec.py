"""What a user submits to the live scheduler (SPEC §9): :class:`JobSpec`, its limits and its checks.

Everything a job spec or a job name holds is validated when the job is submitted, so that no stored
job can later break the service for everyone (a lone surrogate that cannot be written out as UTF-8
broke every listing; ``min_replicas: 1e20`` broke every scheduling round; a 50 MB argument made every
read slow). There are three layers, each raising :class:`SpecError` (a ValueError) whose ``field``
is the dotted path of the culprit relative to the spec ("min_replicas", "resources.GPU", "args.3"),
and whose message starts with that field:

* :meth:`JobSpec.from_dict` — format, types, lengths, numeric ranges and characters; pure, needs
  nothing but the dict. The limits are the module constants below.
* :meth:`JobSpec.check_feasible` — against the nodes of the cluster: could any cluster of these
  nodes ever run the job (enough GPUs per node for one replica, enough slots for ``min_replicas``,
  every other resource present somewhere in the amount asked for)?
* :meth:`JobSpec.check_files` — against the file system as the service sees it: can the
  entrypoint be started in the working directory at all?

Text rules: every string must be valid Unicode, which excludes lone surrogates (``"\\ud800"`` in
JSON); paths (``entrypoint``, ``working_dir``), resource names and job names (:func:`validate_name`)
may hold no control characters at all (C0, DEL, C1, line/paragraph separators, bidirectional
overrides), since they are shown in tables and logs; an argument may hold anything but NUL (which no
process can receive) and surrogates.

Specs read back from the store go through :meth:`JobSpec.from_stored`, which never raises: a row
written by an older Pollux (or by hand) that the current rules refuse still lists, with the first
problem reported beside it.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pollux.contract import BALANCE_MODES, JOB_KINDS

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_ARGS",
    "MAX_ARGS_TOTAL_CHARS",
    "MAX_ARG_CHARS",
    "MAX_BATCH_SIZE",
    "MAX_ENV_NAME_CHARS",
    "MAX_ENV_VARS",
    "MAX_GPUS_PER_REPLICA",
    "MAX_NAME_CHARS",
    "MAX_PATH_CHARS",
    "MAX_REPLICAS",
    "MAX_RESOURCES",
    "MAX_RESOURCE_AMOUNT",
    "MAX_RESOURCE_NAME_CHARS",
    "MIN_RESOURCE_AMOUNT",
    "RESERVED_ENV_PREFIXES",
    "JobSpec",
    "SpecError",
    "is_job_id",
    "validate_name",
]

#: Longest job name (characters).
MAX_NAME_CHARS = 200
#: Longest ``entrypoint`` or ``working_dir`` (characters; Linux's PATH_MAX is 4096 bytes).
MAX_PATH_CHARS = 4096
#: Longest single argument (characters; Linux refuses a single argument over 128 KiB).
MAX_ARG_CHARS = 65536
#: Most arguments.
MAX_ARGS = 1024
#: Longest sum of the arguments' lengths (characters).
MAX_ARGS_TOTAL_CHARS = 262144
#: Largest ``init_batch_size``, ``max_batch_size`` and ``local_bsz_bounds`` entry.
MAX_BATCH_SIZE = 2**31
#: Largest ``min_replicas`` and ``max_replicas``.
MAX_REPLICAS = 10_000
#: Largest ``resources.GPU`` (GPUs per replica).
MAX_GPUS_PER_REPLICA = 1024
#: Most entries in ``resources``.
MAX_RESOURCES = 64
#: Longest resource name (characters).
MAX_RESOURCE_NAME_CHARS = 128
#: Smallest amount of a non-GPU resource (Ray's resource precision is 0.0001).
MIN_RESOURCE_AMOUNT = 1e-4
#: Largest amount of a non-GPU resource (2**53: every integer up to it is exact; memory is in bytes).
MAX_RESOURCE_AMOUNT = float(2**53)
#: At most this many environment variables in a spec (``env``), each name this long.
MAX_ENV_VARS = 256
MAX_ENV_NAME_CHARS = 128
#: Variable names a job may not set: the service sets them (the agent's and Ray's settings).
RESERVED_ENV_PREFIXES = ("POLLUX_", "RAY_")

#: Characters refused in paths, names and resource names: C0 and C1 controls, DEL, line and
#: paragraph separators, bidirectional embeddings/overrides/isolates, lone surrogates.
#: What a job id may be: it names folders, Ray actors and URL path segments.
JOB_ID_PATTERN = r"[A-Za-z0-9._-]{1,128}"
_JOB_ID = re.compile(JOB_ID_PATTERN)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
#: Characters refused in arguments: NUL and lone surrogates.
_ARG_BAD = re.compile("[\x00\ud800-\udfff]")
#: A job's environment variable name (``env``), as POSIX shells accept it.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 4
_repr.maxlevel = 2


def _show(value: Any) -> str:
    """A short, printable rendering of a (possibly huge or hostile) value for an error message."""
    return _repr.repr(value)


def _key(key: Any) -> str:
    """A dict key as it may appear in a field path: escaped if unprintable, shortened if long."""
    text = key if isinstance(key, str) else repr(key)
    if _UNPRINTABLE.search(text):
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= 64 else text[:64] + "..."


class SpecError(ValueError):
    """A job spec (or name) is refused; ``field`` is the dotted path of the culprit.

    ``str(error)`` is ``"<field>: <detail>"``, so the message always starts with the field.
    """

    def __init__(self, field: str, detail: str) -> None:
        self.field = field
        self.detail = detail
        super().__init__(f"{field}: {detail}")


def _char_problem(text: str, pattern: re.Pattern[str]) -> str | None:
    match = pattern.search(text)
    if match is None:
        return None
    char = match.group()
    what = "a lone surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
    return f"contains {what} (U+{ord(char):04X}) at index {match.start()}"


def _text(value: Any, where: str, *, max_chars: int, pattern: re.Pattern[str] = _UNPRINTABLE,
          blank_ok: bool = False) -> str:
    """A string checked for type, length and characters; raises SpecError naming ``where``."""
    if not isinstance(value, str):
        raise SpecError(where, f"expected a string, got {_show(value)}")
    if len(value) > max_chars:
        raise SpecError(where, f"too long: {len(value)} characters, at most {max_chars}")
    if not blank_ok and not value.strip():
        raise SpecError(where, f"expected a non-empty string, got {_show(value)}")
    problem = _char_problem(value, pattern)
    if problem is not None:
        raise SpecError(where, problem)
    return value


def is_job_id(value: str) -> bool:
    """Whether ``value`` may be a job id (:data:`JOB_ID_PATTERN`): the store refuses any other, and
    the API answers any other with 404 without a look-up."""
    return _JOB_ID.fullmatch(value) is not None


def validate_name(name: Any) -> str:
    """A job name as given, if it is a non-blank string of at most :data:`MAX_NAME_CHARS` characters
    with no control characters or lone surrogates (it is printed in tables and terminals, where a
    newline or an escape sequence would forge output); else SpecError with field ``name``."""
    return _text(name, "name", max_chars=MAX_NAME_CHARS)


def _int(data: Mapping[str, Any], name: str, *, minimum: int, maximum: int, default: Any = ...,
         where: str | None = None) -> Any:
    """An integer field: an int, or a float that is exactly integral (JSON ``4.0``); never a bool."""
    where = where or name
    if name not in data or data[name] is None:
        if default is ...:
            raise SpecError(where, "required field is missing")
        return default
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            (isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())):
        raise SpecError(where, f"expected an integer, got {_show(value)}")
    if value < minimum:
        raise SpecError(where, f"must be >= {minimum}, got {_show(value)}")
    if value > maximum:
        raise SpecError(where, f"must be <= {maximum}, got {_show(value)}")
    return int(value)


def _env(value: Any) -> dict[str, str]:
    """The job's own environment variables, checked: names a shell would accept, values of text,
    and no name the service sets itself (``POLLUX_*``, ``RAY_*``): a job may not steer its agent or
    Ray behind the service's back."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError("env", f"expected an object of strings, got {_show(value)}")
    if len(value) > MAX_ENV_VARS:
        raise SpecError("env", f"too many variables: {len(value)}, at most {MAX_ENV_VARS}")
    out: dict[str, str] = {}
    for name, text in value.items():
        where = f"env.{_key(name)}"
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise SpecError(where, "expected a variable name: a letter or _, then letters, digits or _ "
                                   f"(at most {MAX_ENV_NAME_CHARS} characters)")
        if name.startswith(RESERVED_ENV_PREFIXES):
            raise SpecError(where, f"names starting with {' or '.join(RESERVED_ENV_PREFIXES)} are the "
                                   "service's to set")
        out[name] = _text(text, where, max_chars=MAX_ARG_CHARS, pattern=_ARG_BAD, blank_ok=True)
    total = sum(len(k) + len(v) for k, v in out.items())
    if total > MAX_ARGS_TOTAL_CHARS:
        raise SpecError("env", f"too long: {total} characters in all, at most {MAX_ARGS_TOTAL_CHARS}")
    return out


def _resources(value: Any) -> dict[str, float]:
    if value is None:
        return {"GPU": 1.0}
    if not isinstance(value, Mapping):
        raise SpecError("resources", f"expected an object, got {_show(value)}")
    if len(value) > MAX_RESOURCES:
        raise SpecError("resources", f"too many entries: {len(value)}, at most {MAX_RESOURCES}")
    out: dict[str, float] = {"GPU": 1.0}
    for key, amount in value.items():
        where = f"resources.{_key(key)}"
        _text(key, where, max_chars=MAX_RESOURCE_NAME_CHARS)
        if isinstance(amount, bool) or not isinstance(amount, int | float) or \
                (isinstance(amount, float) and not math.isfinite(amount)):
            raise SpecError(where, f"expected a finite number, got {_show(amount)}")
        if key == "GPU":
            if amount != int(amount) or not 1 <= amount <= MAX_GPUS_PER_REPLICA:
                raise SpecError(where, f"GPUs per replica must be an integer between 1 and "
                                       f"{MAX_GPUS_PER_REPLICA}, got {_show(amount)}")
        elif not MIN_RESOURCE_AMOUNT <= amount <= MAX_RESOURCE_AMOUNT:
            raise SpecError(where, f"must be between {MIN_RESOURCE_AMOUNT:g} and "
                                   f"{MAX_RESOURCE_AMOUNT:g} (omit a resource the job does not need), "
                                   f"got {_show(amount)}")
        out[key] = float(amount)
    return out


@dataclass(frozen=True)
class JobSpec:
    """What a user submits: how to run the job and its batch and replica limits.

    ``entrypoint`` and ``init_batch_size`` are required. ``entrypoint`` is a ``.py`` script (run by
    the service's Python interpreter), a path to an executable, or a bare command name looked up on
    the PATH; ``args`` are passed to it. ``working_dir`` (absolute) is where the replicas run; a
    relative entrypoint is resolved against it, or against the service's current directory when it
    is None. ``max_batch_size`` None means a fixed batch; ``local_bsz_bounds`` entries None mean
    unbounded. ``resources`` are Ray resources per replica: ``GPU`` is a whole number of GPUs
    (default 1, also when ``resources`` names only other resources, since every replica holds GPU
    slots); any other resource is a positive amount. ``balance`` is the agent's LB-BSP batch
    balancing (one of ``pollux.contract.BALANCE_MODES``; default ``"off"``), passed to the replicas
    as ``POLLUX_BALANCE`` when it is not off. ``kind`` (``pollux.contract.JOB_KINDS``) is how the job
    follows a new allocation: ``restart`` (default) or ``elastic`` (its master resizes in place).
    ``env`` is added to every replica's environment (the service's own ``POLLUX_*`` and ``RAY_*``
    variables are not the job's to set, and win). See the module docstring for the limits.
    """

    entrypoint: str
    init_batch_size: int
    args: tuple[str, ...] = ()
    working_dir: str | None = None
    max_batch_size: int | None = None
    local_bsz_bounds: tuple[int | None, int | None] | None = None
    min_replicas: int = 0
    max_replicas: int | None = None
    resources: dict[str, float] = field(default_factory=lambda: {"GPU": 1.0})
    preemptible: bool = True
    balance: str = "off"
    kind: str = "restart"
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Validate a spec dict; raises :class:`SpecError` whose message starts with the field."""
        if not isinstance(data, Mapping):
            raise SpecError("spec", f"expected an object, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted((k for k in data if k not in known), key=repr)
        if unknown:
            raise SpecError(_key(unknown[0]), "unknown field")
        if data.get("entrypoint") is None:
            raise SpecError("entrypoint", "required field is missing")
        entry = _text(data["entrypoint"], "entrypoint", max_chars=MAX_PATH_CHARS)
        args = data.get("args")
        args = () if args is None else args
        if isinstance(args, str) or not isinstance(args, Sequence):
            raise SpecError("args", f"expected a list of strings, got {_show(args)}")
        if len(args) > MAX_ARGS:
            raise SpecError("args", f"too many arguments: {len(args)}, at most {MAX_ARGS}")
        for i, arg in enumerate(args):
            _text(arg, f"args.{i}", max_chars=MAX_ARG_CHARS, pattern=_ARG_BAD, blank_ok=True)
        total = sum(len(a) for a in args)
        if total > MAX_ARGS_TOTAL_CHARS:
            raise SpecError("args", f"too long: {total} characters in all, at most {MAX_ARGS_TOTAL_CHARS}")
        working_dir = data.get("working_dir")
        if working_dir is not None:
            _text(working_dir, "working_dir", max_chars=MAX_PATH_CHARS)
            if not os.path.isabs(working_dir):
                raise SpecError("working_dir", f"expected an absolute path, got {_show(working_dir)}")
        init = _int(data, "init_batch_size", minimum=1, maximum=MAX_BATCH_SIZE)
        max_bsz = _int(data, "max_batch_size", minimum=1, maximum=MAX_BATCH_SIZE, default=None)
        if max_bsz is not None and max_bsz < init:
            raise SpecError("max_batch_size", f"{max_bsz} is below init_batch_size {init}")
        bounds = data.get("local_bsz_bounds")
        if bounds is not None:
            if isinstance(bounds, str) or not isinstance(bounds, Sequence) or len(bounds) != 2:
                raise SpecError("local_bsz_bounds", f"expected [lo, hi], got {_show(bounds)}")
            lo, hi = (_int({"b": b}, "b", minimum=1, maximum=MAX_BATCH_SIZE, default=None,
                           where=f"local_bsz_bounds.{i}") for i, b in enumerate(bounds))
            if lo is not None and hi is not None and lo > hi:
                raise SpecError("local_bsz_bounds", f"lower bound {lo} exceeds upper bound {hi}")
            bounds = (lo, hi)
        min_r = _int(data, "min_replicas", minimum=0, maximum=MAX_REPLICAS, default=0)
        max_r = _int(data, "max_replicas", minimum=1, maximum=MAX_REPLICAS, default=None)
        if max_r is not None and max_r < min_r:
            raise SpecError("max_replicas", f"{max_r} is below min_replicas {min_r}")
        res = _resources(data.get("resources"))
        preemptible = data.get("preemptible", True)
        if not isinstance(preemptible, bool):
            raise SpecError("preemptible", f"expected a boolean, got {_show(preemptible)}")
        balance = data.get("balance")
        balance = "off" if balance is None else balance
        if not isinstance(balance, str) or balance not in BALANCE_MODES:
            raise SpecError("balance", f"expected one of {', '.join(BALANCE_MODES)}, got {_show(balance)}")
        kind = data.get("kind")
        kind = "restart" if kind is None else kind
        if not isinstance(kind, str) or kind not in JOB_KINDS:
            raise SpecError("kind", f"expected one of {', '.join(JOB_KINDS)}, got {_show(kind)}")
        env = _env(data.get("env"))
        return cls(entrypoint=entry, init_batch_size=init, args=tuple(args), working_dir=working_dir,
                   max_batch_size=max_bsz, local_bsz_bounds=bounds, min_replicas=min_r,
                   max_replicas=max_r, resources=res, preemptible=preemptible, balance=balance, kind=kind,
                   env=env)

    @classmethod
    def from_stored(cls, text: Any) -> tuple[JobSpec, str | None]:
        """The spec of a stored row and None, or — when the row no longer validates (written by an
        older Pollux or by hand) — a best-effort spec and the first problem found. Never raises.

        The best-effort spec keeps every field that validates: a field that does not falls back to
        its default (a required one to a placeholder: entrypoint ``"<invalid>"``, batch size 1).
        The store fails a non-terminal job whose spec does not validate, so such a spec is only
        ever shown, never run.
        """
        try:
            data = json.loads(text)
        except (TypeError, ValueError, RecursionError) as exc:
            return cls("<invalid>", 1), _show_error(SpecError("spec", f"not valid JSON: {exc}"))
        try:
            return cls.from_dict(data), None
        except (ValueError, TypeError, RecursionError) as exc:
            first = _show_error(exc)
        if not isinstance(data, Mapping):
            return cls("<invalid>", 1), first
        work = dict(data)
        for _ in range(len(work) + 3):
            try:
                return cls.from_dict(work), first
            except SpecError as exc:
                placeholder = {"entrypoint": "<invalid>", "init_batch_size": 1}
                top = next((k for k in work if exc.field == _key(k) or exc.field.startswith(f"{_key(k)}.")),
                           None)
                if exc.field.split(".", 1)[0] in placeholder:
                    name = exc.field.split(".", 1)[0]
                    if work.get(name) == placeholder[name]:
                        break
                    work[name] = placeholder[name]
                elif top is not None:
                    del work[top]
                else:
                    break
            except (ValueError, TypeError, RecursionError):
                break
        return cls("<invalid>", 1), first

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types; ``JobSpec.from_dict(spec.to_dict()) == spec``.

        Field by field rather than ``dataclasses.asdict``, whose recursive deep copy was most of the
        time of listing 5,000 jobs (the containers are copied below; every other field is a scalar).
        """
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["args"] = list(self.args)
        out["local_bsz_bounds"] = None if self.local_bsz_bounds is None else list(self.local_bsz_bounds)
        out["resources"] = dict(self.resources)
        out["env"] = dict(self.env)
        return out

    # -- checks against the cluster and the file system

    def check_feasible(self, nodes: Sequence[Mapping[str, float]]) -> None:
        """Raise SpecError when no cluster of these ``nodes`` could ever run the job.

        Each mapping is one node's total Ray resources ("GPU" included). A replica needs one node
        with ``resources.GPU`` GPUs and every other resource in the amount asked for; the job needs
        ``min_replicas`` such replicas at once. Refused: a GPU count above the largest node's, any
        other resource that no node has that much of (CPU, memory, custom), no node with all of
        them together, or more ``min_replicas`` than replica slots in the whole cluster. Empty
        ``nodes`` (no backend known) checks nothing.
        """
        if not nodes:
            return
        want = dict(self.resources)
        gpus = want.get("GPU", 1.0)
        if not isinstance(gpus, int | float) or not math.isfinite(gpus) or gpus != int(gpus) or gpus < 1:
            raise SpecError("resources.GPU", f"GPUs per replica must be a positive integer, "
                                             f"got {_show(gpus)}")
        want["GPU"] = float(gpus)

        def amount(node: Mapping[str, float], key: str) -> float:
            value = node.get(key, 0.0)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            return float(value) if ok else 0.0

        for key, need in want.items():
            most = max(amount(n, key) for n in nodes)
            if need > most + 1e-9:
                raise SpecError(f"resources.{_key(key)}", f"{need:g} {_key(key)} per replica, but the "
                                                          f"largest node has {most:g}")
        want = {k: need for k, need in want.items() if need > 0}
        slots = sum(min(math.floor(amount(n, k) / need + 1e-9) for k, need in want.items()) for n in nodes)
        if slots == 0:
            raise SpecError("resources", f"no node has all of {_show(dict(want))} at once")
        if self.min_replicas > slots:
            raise SpecError("min_replicas", f"{self.min_replicas} replicas at once, but the cluster "
                                            f"has room for at most {slots} of this job's replicas")

    def check_files(self) -> None:
        """Raise SpecError when the entrypoint cannot be started, as the service sees the paths.

        ``working_dir``, if set, must be an existing directory. A relative entrypoint is resolved
        against ``working_dir``, or against the service's current directory when that is None. A
        ``.py`` entrypoint must be a readable regular file (the interpreter runs it); any other
        must be an executable regular file, or, without a ``/``, a command found on the PATH (an
        executable is never looked up in the working directory).
        """
        for where, text in (("entrypoint", self.entrypoint), ("working_dir", self.working_dir)):
            if text is not None:
                problem = _char_problem(text, _UNPRINTABLE) if isinstance(text, str) else "not a string"
                if problem is not None:
                    raise SpecError(where, problem)
        base = Path(self.working_dir) if self.working_dir is not None else Path.cwd()
        if self.working_dir is not None:
            if not stat.S_ISDIR(_mode("working_dir", base)):
                raise SpecError("working_dir", f"{self.working_dir}: not a directory")
            if not os.access(base, os.X_OK):
                raise SpecError("working_dir", f"{self.working_dir}: permission denied")
        entry = self.entrypoint
        is_script = entry.endswith(".py")
        if not is_script and "/" not in entry:
            if shutil.which(entry) is None:
                hint = f" (to run {entry} in the working directory, write ./{entry})" \
                    if (base / entry).is_file() else ""
                raise SpecError("entrypoint", f"{entry}: command not found on the PATH{hint}")
            return
        path = base / entry
        mode = _mode("entrypoint", path)
        if stat.S_ISDIR(mode):
            raise SpecError("entrypoint", f"{path}: is a directory")
        if not stat.S_ISREG(mode):
            raise SpecError("entrypoint", f"{path}: not a regular file")
        if is_script and not os.access(path, os.R_OK):
            raise SpecError("entrypoint", f"{path}: not readable")
        if not is_script and not os.access(path, os.X_OK):
            raise SpecError("entrypoint", f"{path}: not executable (chmod +x it, or give a .py script)")


def _mode(where: str, path: Path) -> int:
    """``st_mode`` of ``path`` (symlinks followed); SpecError naming ``where`` if it cannot be had."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SpecError(where, f"{path}: no such file or directory") from exc
    except (OSError, ValueError) as exc:
        raise SpecError(where, f"{path}: {getattr(exc, 'strerror', None) or exc}") from exc


def _show_error(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "..."
