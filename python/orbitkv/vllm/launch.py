"""Start an orbitkv-cache-manager when none listens (``start_manager: true``).

vLLM builds worker-side connectors before the scheduler-side one, in several
processes; the first to find the socket silent starts the Manager under an
exclusive ``flock`` on ``<socket>.lock``, the others wait on the lock and then
find it listening. The Manager runs in its own session with its log beside
the socket (``<socket>.log``) and is stopped (SIGTERM) when the process that
started it exits; instances of other processes then miss until one of them
starts a new one. No vLLM import.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from typing import List, Optional

from .config import ConnectorConfig

log = logging.getLogger("orbitkv.vllm")

_started: List[subprocess.Popen] = []


def listening(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def manager_command(cfg: ConnectorConfig, socket_path: str) -> List[str]:
    binary = cfg.resolved_manager_binary()
    found = shutil.which(binary) if os.sep not in binary else binary
    if not found or not os.access(found, os.X_OK):
        raise RuntimeError(
            f"OrbitKVConnector: start_manager is set but the Manager binary {binary!r} is not "
            "executable (set manager_binary or $ORBITKV_MANAGER_BINARY)"
        )
    cmd = [found, "--socket", socket_path, "--pool-size", cfg.pool_size]
    if cfg.ssd_cache_path:
        cmd += ["--ssd-cache-path", cfg.ssd_cache_path, "--ssd-cache-capacity", cfg.ssd_cache_capacity]
    return cmd + list(cfg.manager_args)


def ensure_manager(cfg: ConnectorConfig) -> Optional[subprocess.Popen]:
    """Starts a Manager on the configured socket unless one listens; returns the
    process this call started (None if one was listening). Raises RuntimeError
    naming the log when the started Manager exits or does not listen in time."""
    path = cfg.resolved_socket_path()
    if listening(path):
        return None
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if listening(path):
            return None
        cmd = manager_command(cfg, path)
        log_path = path + ".log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + cfg.manager_start_timeout_s
        while not listening(path):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"OrbitKVConnector: the started Manager exited with {proc.returncode}; "
                    f"see {log_path} ({' '.join(cmd)})"
                )
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"OrbitKVConnector: the started Manager did not listen on {path} within "
                    f"{cfg.manager_start_timeout_s} s; see {log_path}"
                )
            time.sleep(0.02)
    log.info("OrbitKV: started %s (pid %d), log %s", " ".join(cmd), proc.pid, log_path)
    if not _started:
        atexit.register(_stop_started)
    _started.append(proc)
    return proc


def _stop_started() -> None:
    for proc in _started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in _started:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _started.clear()
