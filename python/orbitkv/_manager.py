"""The orbitkv-cache-manager console script: execs the Manager binary bundled
in the wheel (orbitkv/bin/orbitkv-cache-manager) with the same arguments, so
signals, exit status and stdio are the Manager's own."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

_BUNDLED = Path(__file__).resolve().parent / "bin" / "orbitkv-cache-manager"


def manager_binary() -> str:
    """Path of the orbitkv-cache-manager to run: $ORBITKV_MANAGER_BINARY when
    set, else the one bundled in the installed wheel, else the first on PATH
    that is not this console script. Raises FileNotFoundError otherwise (e.g.
    a build-tree package, PYTHONPATH=build/python, without the variable)."""
    env = os.environ.get("ORBITKV_MANAGER_BINARY")
    if env:
        return env
    if os.access(_BUNDLED, os.X_OK):
        return str(_BUNDLED)
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("orbitkv-cache-manager")
    if found and (script is None or Path(found).resolve() != script):
        with open(found, "rb") as f:
            if f.read(2) != b"#!":  # a real binary, not another console script
                return found
    raise FileNotFoundError(
        "no orbitkv-cache-manager: not bundled with this orbitkv package "
        f"({_BUNDLED} is missing); set ORBITKV_MANAGER_BINARY"
    )


def main() -> None:
    binary = manager_binary()
    os.execv(binary, [binary, *sys.argv[1:]])
