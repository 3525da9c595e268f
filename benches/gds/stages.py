"""The qualification sequence of benches.gds (spec "Bare-metal acceptance
script"), one function per step, each appending StageResults to a Run.

A stage is "passed", "failed" or "not available" (its tool or check does not
exist yet, or its interpreter was not given); only "passed" counts towards
qualification. Every stage runs even after an earlier one failed, so a run
still collects its performance evidence; the failures stay failures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Optional

from benches.gds import evidence, procs

PASSED, FAILED, NOT_AVAILABLE = "passed", "failed", "not available"
EXIT_NOT_AVAILABLE = 77  # an engine check's "this check does not exist here"


@dataclasses.dataclass
class StageResult:
    name: str
    step: int  # the spec's sequence number, 1..5
    status: str
    reason: str = ""
    exit: Optional[int] = None
    seconds: float = 0.0
    command: Optional[list] = None
    log: Optional[str] = None
    details: dict = dataclasses.field(default_factory=dict)


class Run:
    """Where a qualification run keeps its state: paths, environment, results."""

    def __init__(self, args, prepared, on_result=None):
        self.args = args
        self.p = prepared
        self.dir = prepared.run_dir
        self.logs = os.path.join(self.dir, "logs")
        self.data = os.path.join(self.dir, "data")
        self.results_dir = os.path.join(self.dir, "results")
        self.env = dict(prepared.env)
        self.results: list[StageResult] = []
        self.runs: list[dict] = []  # per benchmark run summaries
        self.on_result = on_result
        self._counters: dict = {}

    def add(self, r: StageResult) -> StageResult:
        self.results.append(r)
        print(f"[{r.step}] {r.name}: {r.status}{': ' + r.reason if r.reason else ''}", flush=True)
        if self.on_result:
            self.on_result(self)
        return r

    def log_path(self, name: str) -> str:
        return os.path.join(self.logs, re.sub(r"[^\w.-]+", "_", name) + ".log")

    def short_dir(self, kind: str) -> str:
        """A fresh data/<kind><n> directory: short, because Unix sockets go in it."""
        self._counters[kind] = self._counters.get(kind, 0) + 1
        return self.new_dir(f"{kind}{self._counters[kind]}")

    def new_dir(self, *parts: str) -> str:
        """A fresh directory under data/ (never an existing one: no old cache file is reused)."""
        d = os.path.join(self.data, *parts)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        os.mkdir(d, 0o700)
        return d

    def run(self, argv, log, env=None, timeout=None, cwd=None, watch=None):
        """Runs argv to completion, output to `log`. With `watch` (a function
        pid -> Watch), samples the process while it lives. Returns (exit, text,
        seconds, watch); exit None when it could not start or timed out."""
        t0 = time.monotonic()
        with open(log, "w", encoding="utf-8") as out:
            out.write("$ " + shlex.join(argv) + "\n")
            out.flush()
            try:
                p = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env or self.env, cwd=cwd,
                    start_new_session=True,
                )
            except OSError as e:
                out.write(f"cannot start: {e}\n")
                return None, f"cannot start: {e}", 0.0, None
            w = None
            thread = None
            if watch is not None:
                w = watch(p.pid)
                thread = threading.Thread(target=w.run_until_exit, daemon=True)
                thread.start()
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(p)
                rc = None
            except BaseException:  # Ctrl-C: its own session does not get the signal
                _kill_group(p)
                raise
            if thread:
                thread.join(timeout=60)
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        return rc, text, time.monotonic() - t0, w


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait()


def _status(ok: bool) -> str:
    return PASSED if ok else FAILED


# ---------------------------------------------------------------- step 1


def topology(run: Run) -> None:
    smi = shutil.which("nvidia-smi", path=run.env.get("PATH"))
    details = {
        "ssd_dir": run.p.ssd_dir,
        "mount": dataclasses.asdict(run.p.storage.mount),
        "nvme_devices": [dataclasses.asdict(d) for d in run.p.storage.devices],
    }
    if not smi:
        run.add(StageResult("topology", 1, NOT_AVAILABLE, "nvidia-smi not on PATH", details=details))
        return
    log = run.log_path("topology")
    rc1, text1, s1, _ = run.run([smi, "-L"], log + ".list", timeout=120)
    rc2, text2, s2, _ = run.run([smi, "topo", "-m"], log, timeout=120)
    details["gpus"] = [l for l in text1.splitlines()[1:] if l.startswith("GPU")]
    ok = rc1 == 0 and rc2 == 0 and details["gpus"]
    run.add(StageResult("topology", 1, _status(ok), "" if ok else f"nvidia-smi exit {rc1}/{rc2}",
                        exit=rc2, seconds=s1 + s2, command=[smi, "topo", "-m"], log=log, details=details))


def gdscheck(run: Run) -> None:
    argv = run.p.tools["gdscheck"] + ["-p"]
    log = run.log_path("gdscheck")
    rc, text, secs, _ = run.run(argv, log, timeout=300)
    reasons = []
    details: dict = {}
    try:
        check = evidence.parse_gdscheck(text)
        details = {"drivers": check.drivers, "versions": check.versions, "platform_ok": check.platform_ok,
                   "cufile_stats": check.properties.get("profile.cufile_stats")}
        for problem in (evidence.nvme_native_problem(check), evidence.compat_problem(check)):
            if problem:
                reasons.append(problem)
        if check.properties.get("profile.cufile_stats") not in ("3",):
            reasons.append(f"profile.cufile_stats is {check.properties.get('profile.cufile_stats')!r}, not 3")
    except evidence.FormatError as e:
        reasons.append(str(e))
    if rc != 0:
        reasons.insert(0, f"exit {rc}")
    run.add(StageResult("gdscheck -p", 1, _status(not reasons), "; ".join(reasons), exit=rc,
                        seconds=secs, command=argv, log=log, details=details))


def stats_watch(run: Run, name: str):
    path = run.log_path(name)[: -len(".log")] + ".gds_stats.txt"
    return lambda pid: procs.Watch(pid, gds_stats=run.p.tools["gds_stats"], stats_log=path,
                                   interval=run.args.sample_interval, env=run.env)


def gdsio(run: Run) -> None:
    a = run.args
    d = run.new_dir("gdsio")
    target = os.path.join(d, "gdsio.bin")
    for io_type, flag in (("write", "1"), ("read", "0")):
        argv = [run.p.tools["gdsio"], "-f", target, "-d", str(a.gpu), "-w", str(a.gdsio_threads),
                "-s", a.gdsio_size, "-i", a.gdsio_io_size, "-x", "0", "-I", flag, "-T", str(a.gdsio_seconds)]
        name = f"gdsio native {io_type}"
        log = run.log_path(name)
        rc, text, secs, w = run.run(argv, log, timeout=a.gdsio_seconds + 600, watch=stats_watch(run, name))
        reasons = []
        details: dict = {}
        try:
            details["gdsio"] = evidence.parse_gdsio(text)
            if details["gdsio"]["xfer_type"] != "GPUD":
                reasons.append(f"XferType {details['gdsio']['xfer_type']}, not GPUD")
            if details["gdsio"]["ops"] <= 0:
                reasons.append("no operations")
        except evidence.FormatError as e:
            reasons.append(str(e))
        verdict = native_verdict(w, require_reads=io_type == "read", require_writes=io_type == "write")
        details["native"] = dataclasses.asdict(verdict)
        details["process"] = w.record() if w else None
        reasons += verdict.reasons
        if rc != 0:
            reasons.insert(0, f"exit {rc}")
        run.add(StageResult(name, 1, _status(not reasons), "; ".join(reasons), exit=rc, seconds=secs,
                            command=argv, log=log, details=details))


def native_verdict(w: Optional[procs.Watch], require_reads=True, require_writes=True) -> evidence.Verdict:
    if w is None or not w.captures:
        why = (w.stats_error if w and w.stats_error else "the process ended before gds_stats captured it")
        return evidence.Verdict(False, [f"no cuFile statistics: {why}"], {})
    return evidence.judge_native(evidence.parse_gds_stats(w.stats_text), require_reads, require_writes)


# ---------------------------------------------------------------- step 2

# The spec's step-2 groups, by the gate names of gpu_tier_gate_cuda_test.
GATE_GROUPS = (
    ("pinning", re.compile(r"Lease|Pinned|Pinning", re.I)),
    ("fragmented saves", re.compile(r"Fragment", re.I)),
    ("large checkpoints", re.compile(r"Checkpoint", re.I)),
    ("exact GPU-byte recovery", re.compile(r".")),
)


def list_gtests(text: str) -> list[str]:
    """Test names from --gtest_list_tests output ("Suite.\\n  Test  # comment")."""
    out, suite = [], None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("Running main", "Note:")):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        elif suite:
            out.append(suite + line.split("#")[0].strip())
    return out


def gate_group(name: str) -> str:
    return next(g for g, rx in GATE_GROUPS if rx.search(name))


def gpu_gates(run: Run) -> None:
    """gpu_tier_gate_cuda_test, one gate per process; a skip is a failure here."""
    exe = run.p.artifacts["core_test"]
    log = run.log_path("gates-list")
    rc, text, _, _ = run.run([exe, "--gtest_list_tests"], log, timeout=120)
    gates = list_gtests(text) if rc == 0 else []
    if not gates:
        run.add(StageResult("GPU gates", 2, FAILED, f"--gtest_list_tests exit {rc}, no gates", exit=rc, log=log))
        return
    seen = {g: 0 for g, _ in GATE_GROUPS}
    for gate in gates:
        group = gate_group(gate)
        seen[group] += 1
        env = dict(run.env, TMPDIR=run.new_dir("gates", gate.replace("/", "_")), ORBITKV_GPU_TEST_REQUIRE_CUFILE="1")
        argv = [exe, f"--gtest_filter={gate}", "--gtest_color=no"]
        glog = run.log_path("gate-" + gate)
        grc, gtext, secs, _ = run.run(argv, glog, env=env, timeout=run.args.gate_timeout)
        reasons = []
        if grc != 0:
            reasons.append("timed out" if grc is None else f"exit {grc}")
        if "[  SKIPPED ]" in gtext:
            m = re.search(r"Skipped\s*\n(.*)", gtext) or re.search(r"(.*)\n\[  SKIPPED \]", gtext)
            reasons.append("skipped" + (f": {m.group(1).strip()[:200]}" if m else ""))
        if "[  PASSED  ] 1 test" not in gtext and not reasons:
            reasons.append("no '[  PASSED  ] 1 test' line")
        run.add(StageResult(f"gate {gate}", 2, _status(not reasons), "; ".join(reasons), exit=grc,
                            seconds=secs, command=argv, log=glog, details={"group": group}))
    for group, n in seen.items():
        if n == 0:
            run.add(StageResult(f"gates: {group}", 2, NOT_AVAILABLE, f"{exe} has no {group} gate"))


# ---------------------------------------------------------------- step 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Manager:
    """One Manager process of a fault stage, on fresh cache files in `d`."""

    def __init__(self, run: Run, binary: str, d: str, name: str, backend: str, extra_env=None):
        self.run, self.d, self.name = run, d, name
        self.port = free_port()
        self.socket = os.path.join(d, "orbitkv.sock")
        self.log = run.log_path(name + "-manager")
        self.argv = [binary, "--pool-size", "1gb", "--ssd-cache-path", os.path.join(d, "cache.bin"),
                     "--ssd-cache-capacity", run.args.fault_ssd_capacity, "--admission", "reuse",
                     "--ssd-backend", backend, "--socket", self.socket, "--metrics-port", str(self.port)]
        self.env = dict(run.env, **(extra_env or {}))
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 60) -> Optional[str]:
        # A socket left by a killed Manager of this run (our private directory).
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        out = open(self.log, "a", encoding="utf-8")
        out.write("$ " + shlex.join(self.argv) + "\n")
        out.flush()
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"the Manager exited {self.proc.returncode} at startup (see {self.log})"
            if _accepts(self.socket):
                return None
            time.sleep(0.1)
        return f"the Manager's socket did not appear in {timeout:.0f} s"

    def metrics(self) -> Optional[dict]:
        return procs.scrape(self.port)

    def stop(self) -> Optional[int]:
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


_MISMATCH = re.compile(r"(\d+) mismatching bytes")


def engine_mismatches(text: str) -> int:
    return sum(int(m.group(1)) for m in _MISMATCH.finditer(text))


def _hook_armed(log: str, what: str) -> bool:
    return re.search(rf"test hooks:.*cuFile {what}", log) is not None


# (name, Manager binary key, backend, environment, what the hook line names, engine flags)
FAULTS = (
    ("failed cuFile reads", "fault_manager", "auto", {"ORBITKV_TEST_FAIL_CUFILE_READS": "1"}, "reads", ["--retry-failed"]),
    ("failed cuFile writes", "fault_manager", "auto", {"ORBITKV_TEST_FAIL_CUFILE_WRITES": "1"}, "writes", []),
    ("stalled cuFile writes", "fault_manager", "cufile", {"ORBITKV_TEST_HOLD_CUFILE_WRITES_MS": "3000"}, "writes", []),
)


def faults(run: Run) -> None:
    engine = run.p.artifacts["cuda_engine"]
    for fault in FAULTS:
        managers: list = []
        try:
            _fault(run, engine, fault, managers)
        finally:
            for m in managers:
                m.stop()
    manager_death(run)


def _fault(run: Run, engine: str, fault: tuple, managers: list) -> None:
    name, key, backend, env, hook, flags = fault
    t0 = time.monotonic()
    d = run.short_dir("f")
    m = Manager(run, run.p.artifacts[key], d, re.sub(r"\W+", "-", name), backend, env)
    managers.append(m)
    problem = m.start()
    details: dict = {"manager": m.argv, "environment": env, "dir": d}
    reasons: list = []
    erc = None
    if problem is None:
        elog = run.log_path(name + "-engine")
        argv = [engine, "--socket", m.socket, "--device", str(run.args.gpu), "--blocks", "32"] + flags
        erc, etext, _, _ = run.run(argv, elog, timeout=300)
        metrics = m.metrics() or {}
        details["engine"] = {"argv": argv, "exit": erc, "log": elog}
        details["metrics"] = {k: metrics.get(k) for k in procs.STORAGE_METRICS}
        alive = m.proc.poll() is None
        mrc = m.stop()
        details["manager_exit"] = mrc
        log = m.log_text()
        if not _hook_armed(log, hook):
            run.add(StageResult(name, 3, NOT_AVAILABLE,
                                f"{run.p.artifacts[key]} has no hook for {', '.join(env)} (no 'test hooks: ... cuFile {hook}' line)",
                                exit=erc, seconds=time.monotonic() - t0, log=m.log, details=details))
            return
        if engine_mismatches(etext):
            reasons.append(f"{engine_mismatches(etext)} wrong bytes restored")
        if not alive:
            reasons.append("the Manager died during the fault")
        if mrc != 0:
            reasons.append(f"the Manager exited {mrc} on SIGTERM")
        if not metrics:
            reasons.append("no /metrics")
        elif name.startswith("failed"):
            failures = metrics.get(f"orbitkv_ssd_cufile_{hook[:-1]}_failures_total", 0)
            if failures < 1:
                reasons.append(f"orbitkv_ssd_cufile_{hook[:-1]}_failures_total is {failures}")
            if metrics.get("orbitkv_ssd_backend_fallbacks_total") != 1:
                reasons.append(f"orbitkv_ssd_backend_fallbacks_total is {metrics.get('orbitkv_ssd_backend_fallbacks_total')}, not 1")
            if name == "failed cuFile reads" and erc != 0:
                reasons.append(f"the engine exited {erc} after the fallback")
        else:  # stalled: the writes complete late, nothing fails
            if erc != 0:
                reasons.append(f"the engine exited {erc}")
            if metrics.get("orbitkv_ssd_cufile_write_failures_total", 0) or metrics.get("orbitkv_ssd_backend_fallbacks_total", 0):
                reasons.append("a stalled write was counted as failed or caused a fallback")
    else:
        reasons.append(problem)
        m.stop()
    run.add(StageResult(name, 3, _status(not reasons), "; ".join(reasons), exit=erc,
                        seconds=time.monotonic() - t0, log=m.log, details=details))


def manager_death(run: Run) -> None:
    """SIGKILL the Manager under a running engine that has published: the
    engine must fail within its time limit (never hang, never report success),
    and a Manager restarted on the same cache path must serve a new engine
    byte-exact."""
    t0 = time.monotonic()
    name = "Manager death"
    engine = run.p.artifacts["cuda_engine"]
    d = run.short_dir("f")
    m = Manager(run, run.p.artifacts["manager"], d, "manager-death", "cufile")
    m2 = Manager(run, run.p.artifacts["manager"], d, "manager-death-restart", "cufile")
    reasons: list = []
    details: dict = {}
    e = None
    try:
        problem = m.start()
        if problem:
            run.add(StageResult(name, 3, FAILED, problem, log=m.log))
            return
        elog = run.log_path("manager-death-engine")
        argv = [engine, "--socket", m.socket, "--device", str(run.args.gpu), "--blocks", "64",
                "--settle-ms", "5000"]
        with open(elog, "w", encoding="utf-8") as out:
            e = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=run.env)
        published = False
        deadline = time.monotonic() + 120
        while not published and time.monotonic() < deadline and e.poll() is None:
            with open(elog, encoding="utf-8", errors="replace") as f:
                published = "published" in f.read()
            time.sleep(0.05)
        running = e.poll() is None
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        try:
            erc = e.wait(timeout=60)
        except subprocess.TimeoutExpired:
            erc = None
        details["killed_engine"] = {"argv": argv, "exit": erc, "log": elog, "published": published}
        if not (published and running):
            reasons.append(f"the engine did not run under the Manager (exit {e.returncode}, see {elog})")
        elif erc is None:
            reasons.append("the engine hung after the Manager died")
        elif erc == 0:
            reasons.append("the engine reported success with its Manager dead")
        problem = m2.start()
        if problem:
            reasons.append("restart: " + problem)
        else:
            rlog = run.log_path("manager-death-restart-engine")
            rargv = [engine, "--socket", m2.socket, "--device", str(run.args.gpu), "--blocks", "32",
                     "--first-key", "1000"]
            rrc, rtext, _, _ = run.run(rargv, rlog, timeout=300)
            details["restarted_engine"] = {"argv": rargv, "exit": rrc, "log": rlog}
            if rrc != 0 or engine_mismatches(rtext):
                reasons.append(f"after restart the engine exited {rrc} with {engine_mismatches(rtext)} wrong bytes")
        mrc = m2.stop()
        if mrc not in (0, None):
            reasons.append(f"the restarted Manager exited {mrc}")
        run.add(StageResult(name, 3, _status(not reasons), "; ".join(reasons), exit=erc,
                            seconds=time.monotonic() - t0, log=m.log, details=details))
    finally:
        if e is not None and e.poll() is None:
            e.kill()
            e.wait()
        m.stop()
        m2.stop()


# ---------------------------------------------------------------- step 4

# Engine checks: command templates ({python} {repo} {model} {manager} {codec}
# {backend} {workdir} {gpu} {cufile_library}), run from {repo}/python. Exit 0
# passes, 77 is "not available", anything else fails. A check may write JSON
# to $ORBITKV_QUALIFICATION_RESULT; it is kept in qualification.json.
ENGINE_CHECKS = (
    ("real model", "model_python", "model_check",
     "{python} -m pytest -q -p no:cacheprovider {repo}/python/tests/gpu/test_real_model.py "
     "--model {model} --ssd-backend {backend} --storage-codec {codec} --basetemp {workdir}/pytest"),
    ("vLLM", "vllm_python", "vllm_check",
     "{python} -m pytest -q -p no:cacheprovider -m e2e {repo}/python/tests/e2e/test_vllm_e2e_correctness.py "
     "--model {model} --vllm-cache-tier ssd --ssd-backend {backend} --storage-codec {codec} "
     "--max-model-len 4096 --orbitkv-pool-size 1gb --basetemp {workdir}/pytest"),
    ("SGLang", "sglang_python", "sglang_check",
     "{python} -m pytest -q -p no:cacheprovider -m e2e {repo}/python/tests/e2e/test_sglang_direct_e2e.py -k ssd "
     "--model {model} --ssd-backend {backend} --storage-codec {codec} --basetemp {workdir}/pytest"),
)


def expand(template: str, fields: dict) -> list[str]:
    return [tok.format(**fields) for tok in shlex.split(template)]


def missing_repo_paths(argv: list[str], repo: str) -> list[str]:
    """Files the command names inside the repository that do not exist (a
    check another issue has not delivered yet)."""
    prefix = repo.rstrip("/") + "/"
    return [a for a in argv if a.startswith(prefix) and not os.path.exists(a.split("::")[0])]


def engine_checks(run: Run) -> None:
    a = run.args
    for codec in a.storage_codecs:
        for label, py_flag, tmpl_flag, default in ENGINE_CHECKS:
            for backend in a.engine_backends:
                name = f"{label} correctness ({codec}, {backend})"
                python = getattr(a, py_flag) or (a.vllm_python if py_flag == "model_python" else None)
                if not python:
                    run.add(StageResult(name, 4, NOT_AVAILABLE, f"no --{py_flag.replace('_', '-')} given"))
                    continue
                workdir = run.new_dir("engines", re.sub(r"\W+", "-", f"{label}-{codec}-{backend}"))
                fields = {"python": python, "repo": a.repo, "model": run.p.artifacts["model"],
                          "manager": run.p.artifacts["manager"], "codec": codec, "backend": backend,
                          "workdir": workdir, "gpu": a.gpu, "cufile_library": run.p.artifacts["cufile_library"]}
                argv = expand(getattr(a, tmpl_flag) or default, fields)
                absent = missing_repo_paths(argv, a.repo)
                if absent:
                    run.add(StageResult(name, 4, NOT_AVAILABLE, f"{', '.join(absent)} not in this checkout",
                                        command=argv))
                    continue
                result_path = os.path.join(workdir, "result.json")
                env = dict(run.env, ORBITKV_CACHE_MANAGER_BINARY=run.p.artifacts["manager"],
                           LD_PRELOAD=run.p.artifacts["cufile_library"], ORBITKV_STORAGE_CODEC=codec,
                           ORBITKV_SSD_BACKEND=backend, ORBITKV_QUALIFICATION_RESULT=result_path,
                           TMPDIR=workdir)
                log = run.log_path(name)
                cwd = os.path.join(a.repo, "python") if os.path.isdir(os.path.join(a.repo, "python")) else a.repo
                rc, text, secs, _ = run.run(argv, log, env=env, timeout=a.engine_timeout, cwd=cwd)
                details = {}
                if os.path.exists(result_path):
                    try:
                        with open(result_path, encoding="utf-8") as f:
                            details["result"] = json.load(f)
                    except (OSError, json.JSONDecodeError) as e:
                        details["result_error"] = str(e)
                if rc == EXIT_NOT_AVAILABLE:
                    status, reason = NOT_AVAILABLE, "the check says it is not available here (exit 77)"
                elif rc is None:
                    status, reason = FAILED, f"no result within {a.engine_timeout} s"
                else:
                    status, reason = _status(rc == 0), "" if rc == 0 else f"exit {rc}"
                run.add(StageResult(name, 4, status, reason, exit=rc, seconds=secs, command=argv,
                                    log=log, details=details))


# ---------------------------------------------------------------- step 5

BENCH_ROUTES = {"dram": "dram", "io_uring": "ssd-uring", "auto": "ssd-auto", "cufile": "ssd-cufile"}
NATIVE_ROUTES = ("auto", "cufile")


def bench_capabilities(run: Run) -> dict:
    log = run.log_path("bench-help")
    rc, text, _, _ = run.run([run.p.artifacts["bench"], "--help"], log, timeout=60)
    return {"ok": rc == 0, "storage_codec": "--storage-codec" in text,
            "routes": {r for r in BENCH_ROUTES.values() if re.search(rf"\b{re.escape(r)}\b", text)}}


def _first_route(report: dict) -> Optional[dict]:
    for point in report.get("points", []):
        for route in point.get("routes", []):
            return route
    return None


def summarize_bench(report: dict) -> dict:
    r = _first_route(report) or {}
    return {
        "status": r.get("status"),
        "ttft_ms": (r.get("ttft") or {}).get("cached_ms"),
        "restore_gbps": (r.get("restore") or {}).get("gbps"),
        "publish_gbps": (r.get("publish") or {}).get("gbps"),
        "latency_ms": r.get("latency_ms"),
        "hits": r.get("hits"),
        "cpu": r.get("cpu"),
        "amplification": r.get("amplification"),
        "verification": r.get("verification"),
        "capacities": report.get("capacities"),
        "seed": report.get("seed"),
    }


def judge_bench_run(route: str, rc, report: Optional[dict], watches: list) -> list[str]:
    """Why a benchmark run fails (empty: it passes)."""
    reasons = []
    if rc is None:
        reasons.append("timed out")
    elif rc == 1:
        reasons.append("wrong bytes restored (exit 1)")
    elif rc != 0:
        reasons.append(f"exit {rc}")
    if report is None:
        reasons.append("no JSON report")
    else:
        r = _first_route(report)
        if r is None or r.get("status") != "ok":
            reasons.append(f"route not run: {(r or {}).get('reason', 'absent from the report')}")
        elif not (r.get("verification") or {}).get("ok", False):
            reasons.append("verification failed")
    if not watches:
        reasons.append("no Manager process was seen")
    if route in NATIVE_ROUTES:
        for w in watches:
            v = native_verdict(w)
            reasons += [f"Manager {w.pid}: {x}" for x in v.reasons]
            m = w.metrics
            if m is None:
                reasons.append(f"Manager {w.pid}: no /metrics scraped")
                continue
            if m.get("orbitkv_ssd_backend_fallbacks_total", 0) > 0:
                reasons.append(f"Manager {w.pid}: backend fallback (orbitkv_ssd_backend_fallbacks_total "
                               f"{m['orbitkv_ssd_backend_fallbacks_total']:.0f})")
            for k in ("orbitkv_ssd_cufile_read_bytes_total", "orbitkv_ssd_cufile_write_bytes_total"):
                if m.get(k, 0) <= 0:
                    reasons.append(f"Manager {w.pid}: {k} is {m.get(k, 0):.0f}")
    return reasons


def benchmarks(run: Run) -> None:
    a = run.args
    caps = bench_capabilities(run)
    manager = run.p.artifacts["manager"]
    for workload in a.workloads:
        for codec in a.storage_codecs:
            for route in a.routes:
                name = f"bench {workload} {codec} {route}"
                bench_route = BENCH_ROUTES[route]
                if not caps["ok"]:
                    run.add(StageResult(name, 5, FAILED, "orbitkv-bench --help failed"))
                    continue
                if bench_route not in caps["routes"]:
                    run.add(StageResult(name, 5, NOT_AVAILABLE, f"orbitkv-bench has no {bench_route} route"))
                    continue
                if codec != "none" and not caps["storage_codec"]:
                    run.add(StageResult(name, 5, NOT_AVAILABLE, "orbitkv-bench has no --storage-codec"))
                    continue
                d = run.short_dir("b")
                report_path = os.path.join(run.results_dir, re.sub(r"\W+", "-", name) + ".json")
                argv = [run.p.artifacts["bench"], "--workload", workload, "--routes", bench_route,
                        "--device", f"cuda:{a.gpu}", "--seed", str(a.seed), "--pool-size", a.pool_size,
                        "--ssd-capacity", a.ssd_capacity, "--ssd-dir", d, "--manager", manager,
                        "--json", report_path, "--no-progress"]
                if caps["storage_codec"]:
                    argv += ["--storage-codec", codec]
                argv += shlex.split(a.bench_args)
                tree: dict = {}

                def watch_tree(pid, _tree=tree, _name=name):
                    gds = run.p.tools["gds_stats"] if route in NATIVE_ROUTES else None
                    path = run.log_path(_name)[: -len(".log")] + ".gds_stats.txt"
                    t = procs.ProcessTreeWatch(
                        pid, lambda argv: procs.runs_program(argv, manager),
                        lambda mpid: procs.Watch(mpid, gds_stats=gds, stats_log=path, interval=a.sample_interval,
                                                 env=run.env),
                        interval=min(0.5, a.sample_interval)).start()
                    _tree["t"] = t
                    return _TreeJoin(t)

                log = run.log_path(name)
                rc, _, secs, _ = run.run(argv, log, timeout=a.bench_timeout, watch=watch_tree)
                watches = tree["t"].join() if "t" in tree else []
                report = None
                if os.path.exists(report_path):
                    try:
                        with open(report_path, encoding="utf-8") as f:
                            report = json.load(f)
                    except (OSError, json.JSONDecodeError):
                        report = None
                reasons = judge_bench_run(route, rc, report, watches)
                summary = {"name": name, "workload": workload, "codec": codec, "route": route,
                           "exit": rc, "seconds": secs, "passed": not reasons, "report": report_path,
                           "ssd_dir": d,
                           **(summarize_bench(report) if report else {}),
                           "managers": [w.record() for w in watches]}
                if route in NATIVE_ROUTES:
                    summary["native"] = [dataclasses.asdict(native_verdict(w)) for w in watches]
                run.runs.append(summary)
                run.add(StageResult(name, 5, _status(not reasons), "; ".join(reasons), exit=rc,
                                    seconds=secs, command=argv, log=log))


class _TreeJoin:
    """Adapts ProcessTreeWatch to Run.run's watch protocol (run_until_exit)."""

    def __init__(self, t: procs.ProcessTreeWatch):
        self.t = t

    def run_until_exit(self):
        while procs.Watch(self.t.parent_pid).alive():
            time.sleep(0.2)


SEQUENCE = (topology, gdscheck, gdsio, gpu_gates, faults, engine_checks, benchmarks)
