"""Evidence about live processes: /proc accounting, the Manager's /metrics and
cuFile statistics captured with gds_stats while the process is alive.

A Watch samples one process (a Manager, gdsio) until it exits and keeps the
last good sample of each kind; ProcessTreeWatch finds the Managers that a
driver process (orbitkv-bench) starts and watches each of them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import threading
import time
import urllib.request
from typing import Callable, Optional

from benches.gds import evidence

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_cpu_seconds(pid: int, proc: str = "/proc") -> Optional[float]:
    """User + system CPU seconds of `pid` from /proc/<pid>/stat (None: gone)."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    # After "pid (comm) ": state is field 3; utime and stime are fields 14, 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def read_proc_io(pid: int, proc: str = "/proc") -> Optional[dict]:
    """/proc/<pid>/io (rchar, wchar, read_bytes, write_bytes, ...); None when
    gone or not readable (it needs the same user, or root)."""
    try:
        with open(f"{proc}/{pid}/io", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if v.strip().isdigit():
            out[k.strip()] = int(v)
    return out or None


def read_cmdline(pid: int, proc: str = "/proc") -> Optional[list[str]]:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def children_of(ppid: int, proc: str = "/proc") -> list[int]:
    out = []
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(ppid):
            out.append(int(name))
    return sorted(out)


def flag_value(argv: list[str], flag: str) -> Optional[str]:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def runs_program(argv: list, program: str) -> bool:
    """Whether a command line runs `program` (resolved path): as argv[0], or as
    the script an interpreter runs (argv[1])."""
    return any(os.path.realpath(a) == program for a in argv[:2])


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {metric name: sum over its label sets}; histogram
    buckets are left out (their _sum and _count stay)."""
    out: dict = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1).endswith("_bucket"):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


# Loopback only: never through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(port: int, timeout: float = 2.0) -> Optional[dict]:
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return parse_metrics(r.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None


# The counters kept per run (summed over device labels).
STORAGE_METRICS = (
    "orbitkv_ssd_backend_fallbacks_total",
    "orbitkv_ssd_cufile_read_bytes_total",
    "orbitkv_ssd_cufile_write_bytes_total",
    "orbitkv_ssd_cufile_read_failures_total",
    "orbitkv_ssd_cufile_write_failures_total",
    "orbitkv_ssd_gpu_write_fallbacks_total",
    "orbitkv_ssd_uring_read_bytes_total",
    "orbitkv_ssd_uring_write_bytes_total",
    "orbitkv_ssd_uring_read_ops_total",
    "orbitkv_ssd_uring_write_ops_total",
    "orbitkv_ssd_objects_written_total",
    "orbitkv_ssd_write_drops_total",
    "orbitkv_ssd_pinned_write_skips_total",
)


@dataclasses.dataclass
class Watch:
    """Samples one live process every `interval` s: CPU, /proc/<pid>/io, the
    /metrics of its --metrics-port and, with `gds_stats`, its cuFile statistics
    (raw captures appended to `stats_log`)."""

    pid: int
    gds_stats: Optional[str] = None
    stats_log: Optional[str] = None
    interval: float = 1.0
    proc: str = "/proc"
    env: Optional[dict] = None  # gds_stats's environment (default: this process's)
    cmdline: Optional[list] = None
    cpu_seconds: Optional[float] = None
    io: Optional[dict] = None
    metrics: Optional[dict] = None
    metrics_port: Optional[int] = None
    stats_text: Optional[str] = None
    stats_error: Optional[str] = None
    captures: int = 0
    samples: int = 0

    def alive(self) -> bool:
        return os.path.exists(f"{self.proc}/{self.pid}/stat") and not _zombie(self.pid, self.proc)

    def sample(self) -> bool:
        """One sample; False when the process is gone."""
        if not self.alive():
            return False
        if self.cmdline is None:
            self.cmdline = read_cmdline(self.pid, self.proc)
            port = flag_value(self.cmdline or [], "--metrics-port")
            self.metrics_port = int(port) if port and port.isdigit() and int(port) else None
        cpu = read_cpu_seconds(self.pid, self.proc)
        io = read_proc_io(self.pid, self.proc)
        metrics = scrape(self.metrics_port) if self.metrics_port else None
        if self.gds_stats:
            self._capture_stats()
        if not self.alive():  # values read while exiting may be partial: keep the older ones
            return False
        self.samples += 1
        if cpu is not None:
            self.cpu_seconds = cpu
        if io is not None:
            self.io = io
        if metrics is not None:
            self.metrics = metrics
        return True

    def _capture_stats(self) -> None:
        try:
            p = subprocess.run(
                [self.gds_stats, "-p", str(self.pid), "-l", "3"],
                capture_output=True,
                text=True,
                timeout=30,
                env=self.env,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            self.stats_error = f"gds_stats did not run: {e}"
            return
        text = p.stdout
        if self.stats_log:
            with open(self.stats_log, "a", encoding="utf-8") as f:
                f.write(f"### {time.strftime('%H:%M:%S')} gds_stats -p {self.pid} -l 3 (exit {p.returncode})\n")
                f.write(text)
                if p.stderr:
                    f.write(p.stderr)
        if p.returncode != 0:
            # A call that raced with the exit says only that the process is gone: keep the earlier reason.
            if self.stats_error is None or self.alive():
                self.stats_error = f"gds_stats exit {p.returncode}: {(p.stderr or text).strip()[:200]}"
            return
        try:
            evidence.parse_gds_stats(text)
        except evidence.FormatError as e:
            self.stats_error = f"gds_stats output not understood: {e}"
            return
        self.stats_text = text
        self.captures += 1

    def run_until_exit(self, stop: Optional[threading.Event] = None) -> None:
        while self.sample():
            if stop is not None and stop.wait(self.interval):
                break
            if stop is None:
                time.sleep(self.interval)

    def record(self) -> dict:
        stats = None
        if self.stats_text:
            stats = evidence.parse_gds_stats(self.stats_text)
        out = {
            "pid": self.pid,
            "samples": self.samples,
            "cpu_seconds": self.cpu_seconds,
            "proc_io": self.io,
            "metrics": {k: self.metrics.get(k) for k in STORAGE_METRICS} if self.metrics else None,
        }
        if self.gds_stats:
            out["gds_stats"] = {
                "captures": self.captures,
                "error": self.stats_error if not self.captures else None,
                "version": stats.version if stats else None,
                "per_gpu": stats.per_gpu if stats else None,
                "global": stats.global_stats if stats else None,
            }
        return out


def _zombie(pid: int, proc: str) -> bool:
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return True
    state = text[text.rfind(")") + 2 :].split()[:1]
    return state == ["Z"] or state == ["X"]


class ProcessTreeWatch:
    """Watches every child of `parent_pid` that `is_target(argv)` accepts, each
    with its own Watch thread, until the parent exits (call join)."""

    def __init__(
        self,
        parent_pid: int,
        is_target: Callable[[list], bool],
        make_watch: Callable[[int], Watch],
        interval: float = 0.5,
        proc: str = "/proc",
    ):
        self.parent_pid = parent_pid
        self.is_target = is_target
        self.make_watch = make_watch
        self.interval = interval
        self.proc = proc
        self.watches: list[Watch] = []
        self._seen: set = set()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "ProcessTreeWatch":
        self._thread.start()
        return self

    def _loop(self) -> None:
        parent_argv = read_cmdline(self.parent_pid, self.proc)
        while not self._stop.is_set():
            for pid in children_of(self.parent_pid, self.proc):
                if pid in self._seen:
                    continue
                argv = read_cmdline(pid, self.proc)
                if argv is None or argv == parent_argv:  # gone, or forked but not yet exec'd
                    continue
                self._seen.add(pid)
                if not self.is_target(argv):
                    continue
                w = self.make_watch(pid)
                self.watches.append(w)
                t = threading.Thread(target=w.run_until_exit, daemon=True)
                t.start()
                self._threads.append(t)
            self._stop.wait(self.interval)

    def join(self) -> list[Watch]:
        self._stop.set()
        self._thread.join()
        for t in self._threads:
            t.join(timeout=60)
        return self.watches
