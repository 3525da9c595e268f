"""Fixtures of the vLLM connector tests: real orbitkv-cache-manager processes.

Run in the pinned vLLM environment (scripts/vllm_env.sh) with the orbitkv
module built for its interpreter on PYTHONPATH and $ORBITKV_MANAGER_BINARY
naming the Manager (scripts/test.sh sets all three). Without vLLM or orbitkv
every test here is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # kvreplay, harness

try:
    import orbitkv  # noqa: F401
    import vllm  # noqa: F401
except ImportError as e:  # pragma: no cover - environment without vLLM
    pytest.skip(f"vLLM connector tests need vllm and orbitkv: {e}", allow_module_level=True)

TMP_ROOT = "/var/tmp" if os.path.isdir("/var/tmp") else None


class ManagerProc:
    """An orbitkv-cache-manager on a fixed socket; can be killed, paused, restarted."""

    def __init__(self, binary: str, workdir: Path, pool_size: str, ssd: bool) -> None:
        self.binary, self.workdir, self.pool_size, self.ssd = binary, workdir, pool_size, ssd
        self.socket_path = str(workdir / "m.sock")
        self.log_path = workdir / "manager.log"
        self.proc = None
        self.start()

    def start(self) -> None:
        args = [self.binary, "--socket", self.socket_path, "--metrics-port", "0",
                "--pool-size", self.pool_size]
        if self.ssd:
            (self.workdir / "ssd").mkdir(exist_ok=True)
            args += ["--ssd-cache-path", str(self.workdir / "ssd" / "cache.bin"),
                     "--ssd-cache-capacity", "64mib", "--ssd-shards", "2"]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Manager exited with {self.proc.returncode}:\n{self.log()}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket_path)
                return
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        raise RuntimeError(f"Manager did not listen:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"Manager ignored SIGTERM:\n{self.log()}")
            self._log.close()
            return self.proc.returncode
        return 0


@pytest.fixture
def start_manager():
    binary = os.environ.get("ORBITKV_MANAGER_BINARY", "")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"set ORBITKV_MANAGER_BINARY to orbitkv-cache-manager (got {binary!r})")
    started, dirs = [], []

    def start(pool_size: str = "64mib", ssd: bool = False) -> ManagerProc:
        d = Path(tempfile.mkdtemp(prefix="orbitkv-vllm-", dir=TMP_ROOT))
        dirs.append(d)
        m = ManagerProc(binary, d, pool_size, ssd)
        started.append(m)
        return m

    yield start
    failures = [f"Manager exited with {rc}:\n{m.log()}" for m in started if (rc := m.stop()) != 0]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    assert not failures, "\n".join(failures)


@pytest.fixture
def manager(start_manager) -> ManagerProc:
    return start_manager()


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    import harness

    return harness.model_dir(tmp_path_factory.mktemp("model"))
