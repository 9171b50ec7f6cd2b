"""Programs the end-to-end tests run that come from Debian's packages (a real ``prometheus``, a real
``chromium``): found on PATH, else installed with apt-get where the tests run as root (CI and the
development machines do), else the test is skipped, saying why."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

#: Seconds an install may take (a browser is a few hundred MB).
INSTALL_TIMEOUT_S = 900


def _apt_install(package: str) -> str | None:
    """Install ``package`` with apt-get; None, or why it could not be."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:   # the package lists may be missing or stale on a new machine
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=INSTALL_TIMEOUT_S)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        return f"apt-get install {package} failed: {done.stderr.strip()[-300:]}"
    return None


def debian_program(program: str, package: str) -> str:
    """The path of ``program``, installing Debian's ``package`` if needed; skips the test (with the
    reason) where it cannot be had: not root, no apt-get, or the install failed."""
    found = shutil.which(program)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{program} is not installed and cannot be (needs root and apt-get: "
                    f"apt-get install {package})")
    why = _apt_install(package)
    if why is not None:
        pytest.skip(why)
    found = shutil.which(program)
    if not found:
        pytest.skip(f"apt-get installed {package} but {program} is not on PATH")
    return found
