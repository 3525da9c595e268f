"""Fixtures: a real orbitkv-cache-manager per test, on a temporary socket with
a temporary SSD cache directory under /var/tmp (disk-backed, not tmpfs).

The binary comes from $ORBITKV_MANAGER_BINARY (ctest sets it), else the one
bundled in the installed wheel (scripts/py_env.sh), else
build/src/server/orbitkv-cache-manager. The orbitkv package must be importable
(ctest sets PYTHONPATH=<build>/python).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import orbitkv

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO / "build" / "src" / "server" / "orbitkv-cache-manager"
TMP_ROOT = "/var/tmp" if os.path.isdir("/var/tmp") else None


class Manager:
    """A running orbitkv-cache-manager process."""

    def __init__(self, binary: str, workdir: Path, pool_size: str, extra: list[str]):
        self.workdir = workdir
        self.socket_path = str(workdir / "m.sock")
        self.ssd_dir = workdir / "ssd"
        self.ssd_dir.mkdir()
        self.log_path = workdir / "manager.log"
        args = [
            binary,
            "--socket", self.socket_path,
            "--metrics-port", "0",
            "--pool-size", pool_size,
            "--ssd-cache-path", str(self.ssd_dir / "cache.bin"),
            "--ssd-cache-capacity", "64mib",
            "--ssd-shards", "2",
            *extra,
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"Manager exited with {self.proc.returncode} before listening:\n{self.log()}"
                )
            if os.path.exists(self.socket_path):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(self.socket_path)
                    return
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"Manager did not listen on {self.socket_path}:\n{self.log()}")

    def client(self, **kwargs) -> orbitkv.Client:
        return orbitkv.Client(self.socket_path, **kwargs)

    def stop(self) -> int:
        """SIGTERM, wait for a clean exit; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"Manager ignored SIGTERM for 30 s:\n{self.log()}")
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def manager_binary() -> str:
    try:  # $ORBITKV_MANAGER_BINARY, else the one in the installed wheel
        binary = orbitkv.manager_binary()
    except FileNotFoundError:
        binary = str(DEFAULT_BINARY)
    if not os.access(binary, os.X_OK):
        pytest.fail(f"Manager binary {binary} is missing (set ORBITKV_MANAGER_BINARY)")
    return binary


@pytest.fixture
def start_manager(manager_binary):
    """Factory: start_manager(pool_size="64mib", extra=[...]) -> Manager. Every
    Manager started is stopped with SIGTERM at teardown and must exit 0."""
    started: list[Manager] = []
    dirs: list[str] = []

    def start(pool_size: str = "64mib", extra: list[str] | None = None) -> Manager:
        workdir = tempfile.mkdtemp(prefix="orbitkv-py-", dir=TMP_ROOT)
        dirs.append(workdir)
        m = Manager(manager_binary, Path(workdir), pool_size, list(extra or []))
        started.append(m)
        return m

    yield start

    failures = []
    for m in started:
        rc = m.stop()
        if rc != 0:
            failures.append(f"Manager exited with {rc}:\n{m.log()}")
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    assert not failures, "\n".join(failures)


@pytest.fixture
def manager(start_manager) -> Manager:
    return start_manager()


@pytest.fixture
def client(manager):
    c = manager.client()
    yield c
    c.close()
