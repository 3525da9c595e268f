"""Fixtures: a real orbitkv-cache-manager per test, on a temporary socket with
a temporary SSD cache directory under /var/tmp (disk-backed, not tmpfs).

The binary comes from $ORBITKV_MANAGER_BINARY (ctest sets it), else the one
bundled in the installed wheel (scripts/py_env.sh), else
build/src/server/orbitkv-cache-manager. The orbitkv package must be importable
(ctest sets PYTHONPATH=<build>/python).
"""

from __future__ import annotations

import contextlib
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
    """A running orbitkv-cache-manager process on a fixed socket (ssd: with an
    SSD cache under workdir/ssd). It can be killed, paused (SIGSTOP),
    resumed and started again on the same socket and state."""

    def __init__(self, binary: str, workdir: Path, pool_size: str, extra: list[str],
                 ssd: bool = True):
        self.binary, self.workdir, self.pool_size = binary, workdir, pool_size
        self.extra, self.ssd = list(extra), ssd
        self.socket_path = str(workdir / "m.sock")
        self.ssd_dir = workdir / "ssd"
        self.log_path = workdir / "manager.log"
        self.start()

    def start(self) -> None:
        """Starts the process (again, after kill()) and waits until it listens."""
        args = [self.binary, "--socket", self.socket_path, "--metrics-port", "0",
                "--pool-size", self.pool_size]
        if self.ssd:
            self.ssd_dir.mkdir(exist_ok=True)
            args += ["--ssd-cache-path", str(self.ssd_dir / "cache.bin"),
                     "--ssd-cache-capacity", "64mib", "--ssd-shards", "2"]
        self.killed_by_test = False
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([*args, *self.extra], stdout=self._log,
                                     stderr=subprocess.STDOUT)
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

    def kill(self) -> None:
        """SIGKILL (the test means it: stop() then reports 0, unless start()ed again)."""
        self.killed_by_test = True
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> int:
        """SIGTERM, wait for a clean exit; returns the exit code (0 after kill())."""
        if self.killed_by_test:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused one too
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


@contextlib.contextmanager
def managers(binary: str, ssd_default: bool = True):
    """The Manager factory behind start_manager fixtures (tests/vllm and
    tests/sglang load it from here): start(pool_size="64mib", extra=[...],
    ssd=ssd_default) -> Manager. Every Manager started is stopped with SIGTERM
    at the end and must exit 0."""
    started: list[Manager] = []
    dirs: list[str] = []

    def start(pool_size: str = "64mib", extra: list[str] | None = None,
              ssd: bool = ssd_default) -> Manager:
        workdir = tempfile.mkdtemp(prefix="orbitkv-py-", dir=TMP_ROOT)
        dirs.append(workdir)
        m = Manager(binary, Path(workdir), pool_size, list(extra or []), ssd)
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
def start_manager(manager_binary):
    """start_manager(pool_size="64mib", extra=[...], ssd=True) -> Manager (managers())."""
    with managers(manager_binary) as start:
        yield start


@pytest.fixture
def manager(start_manager) -> Manager:
    return start_manager()


@pytest.fixture
def client(manager):
    c = manager.client()
    yield c
    c.close()
