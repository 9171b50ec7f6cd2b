"""The benchmark scripts as modules, for the tests of their pure parts.

A script under ``benchmarks/`` is not in a package, so a test imports it from its file. It is
registered in ``sys.modules`` before it runs, because dataclasses look their module up there; one that
imports the scripts beside it (``scale.py`` reuses ``sim_profile.py``) gets its folder on ``sys.path``
while it loads.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def load_script(path: Path, name: str, *, with_siblings: bool = False) -> ModuleType:
    """The script at ``path`` imported afresh as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.parent)
    added = with_siblings and folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if added:
            sys.path.remove(folder)
    return module
