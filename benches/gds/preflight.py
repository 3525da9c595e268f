"""The refusals of benches.gds: everything checked before anything runs.

preflight() either returns what the run needs (resolved artifact paths, the
storage check, the private run directory with its cuFile configuration) or
raises Refusal with one line that says what is wrong and why native GDS
cannot be qualified that way.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import time
from typing import Callable, Optional

from benches.gds import cufile_config, evidence, host

RUN_DIR_PREFIX = "orbitkv-qual-"
# Sockets live in data/<kind><n>/ (stages.Run.short_dir); sun_path holds 107 bytes.
LONGEST_SOCKET = "/data/b9999/orbitkv.sock"
MAX_SOCKET_PATH = 107
COMPAT_ENV = ("CUFILE_ALLOW_COMPAT_MODE", "CUFILE_FORCE_COMPAT_MODE")
_TRUE = {"1", "true", "yes", "on", "y", "t"}


class Refusal(Exception):
    pass


@dataclasses.dataclass
class Prepared:
    ssd_dir: str
    storage: host.StorageCheck
    tools: dict  # gdscheck, gdsio, gds_stats: argv prefixes / paths
    artifacts: dict  # manager, fault_manager, core_test, bench, cuda_engine, cufile_library, model
    run_dir: str
    cufile_json: str
    cufile_source: str
    gdscheck_text: str
    env: dict  # the environment every child gets
    virtualization: list


def _executable(path: Optional[str]) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def gdscheck_argv(tools_dir: str) -> Optional[list]:
    """How to run NVIDIA's gdscheck from --gds-tools: gdscheck.py (through
    Python when not executable) or the gdscheck binary of newer releases."""
    py = os.path.join(tools_dir, "gdscheck.py")
    if os.path.isfile(py):
        return [py] if os.access(py, os.X_OK) else [sys.executable, py]
    binary = os.path.join(tools_dir, "gdscheck")
    if _executable(binary):
        return [binary]
    return None


def default_sibling(anchor: Optional[str], names: list) -> Optional[str]:
    """The first existing executable among `names` (relative to the directory of
    `anchor`): where a bundle or a build tree puts the other artifacts."""
    if not anchor:
        return None
    base = os.path.dirname(os.path.abspath(anchor))
    for n in names:
        p = os.path.normpath(os.path.join(base, n))
        if _executable(p):
            return p
    return None


def _is_true(v: Optional[str]) -> bool:
    return v is not None and v.strip().lower() in _TRUE


def preflight(
    args,
    root: str = "/",
    environ: Optional[dict] = None,
    detect_virt: Optional[Callable[[], Optional[str]]] = None,
    now: Optional[float] = None,
) -> Prepared:
    environ = dict(os.environ if environ is None else environ)
    # 1. Bare metal only: a container or a VM cannot show the native path.
    found = host.detect_virtualization(root, detect_virt)
    if found:
        kinds = sorted({f.kind for f in found})
        what = "container" if kinds == ["container"] else "container or virtual machine"
        raise Refusal(
            f"refused: this host is a {what} ({'; '.join(f.evidence for f in found)}); "
            "native GPUDirect Storage can only be qualified on bare metal"
        )
    # 2. The storage: an existing directory on ext4/XFS backed only by NVMe.
    if not args.ssd_dir:
        raise Refusal("refused: --ssd-dir is required (a directory on an NVMe-backed ext4/XFS mount)")
    try:
        st = os.stat(args.ssd_dir)
    except OSError as e:
        raise Refusal(f"refused: --ssd-dir {args.ssd_dir}: {e.strerror}") from None
    if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
        raise Refusal(f"refused: --ssd-dir {args.ssd_dir} is a device; give a directory on its file system (a raw disk is never opened)")
    if not stat.S_ISDIR(st.st_mode):
        raise Refusal(f"refused: --ssd-dir {args.ssd_dir} is not a directory")
    ssd_dir = os.path.realpath(args.ssd_dir)
    storage = host.check_storage(ssd_dir, root)
    if storage.problem:
        raise Refusal(f"refused: --ssd-dir {storage.problem}")
    # 3. Tools, library and prebuilt artifacts.
    missing = []
    tools: dict = {}
    if not args.gds_tools or not os.path.isdir(args.gds_tools):
        raise Refusal(f"refused: --gds-tools {args.gds_tools or '(unset)'} is not a directory (it holds NVIDIA's gdscheck.py, gdsio and gds_stats)")
    tools["gdscheck"] = gdscheck_argv(args.gds_tools)
    if tools["gdscheck"] is None:
        missing.append(f"gdscheck.py in {args.gds_tools}")
    for name in ("gdsio", "gds_stats"):
        p = os.path.join(args.gds_tools, name)
        tools[name] = p
        if not _executable(p):
            missing.append(f"{name} in {args.gds_tools}")
    lib = args.cufile_library
    if not lib or not os.path.isfile(lib):
        missing.append(f"--cufile-library {lib or '(unset)'}")
    artifacts = {"cufile_library": os.path.realpath(lib) if lib else None}
    bench = args.bench or default_sibling(args.manager, ["orbitkv-bench", "../bench/orbitkv-bench"])
    engine = args.cuda_engine or default_sibling(
        args.manager, ["orbitkv-cuda-engine", "../gpu/tests/orbitkv-cuda-engine"]
    )
    for key, flag, path in (
        ("manager", "--manager", args.manager),
        ("fault_manager", "--fault-manager", args.fault_manager),
        ("core_test", "--core-test", args.core_test),
        ("bench", "--bench", bench),
        ("cuda_engine", "--cuda-engine", engine),
    ):
        if not _executable(path):
            missing.append(f"{flag} {path or '(unset; not found next to --manager)'}")
        artifacts[key] = os.path.realpath(path) if path else None
    if not args.model or not os.path.isdir(args.model):
        missing.append(f"--model {args.model or '(unset)'} (a model directory)")
    artifacts["model"] = os.path.realpath(args.model) if args.model else None
    if missing:
        raise Refusal("refused: missing or not executable: " + "; ".join(missing))
    # 4. Compatibility mode: the caller's environment must not re-enable it.
    for var in COMPAT_ENV:
        if _is_true(environ.get(var)):
            raise Refusal(
                f"refused: {var}={environ[var]} in the environment turns cuFile compatibility mode "
                "on (host staging); native qualification needs it off: unset it"
            )
    source, looked = cufile_config.find_source(args.cufile_json, artifacts["cufile_library"], environ, root)
    if source is None:
        raise Refusal("refused: no cufile.json to copy (looked at " + ", ".join(looked) + "); pass --cufile-json")
    try:
        cufile_config.load(source)
    except cufile_config.ConfigError as e:
        raise Refusal(f"refused: {e}") from None
    # The private run directory: new, ours, under --ssd-dir.
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    run_dir = os.path.join(ssd_dir, f"{RUN_DIR_PREFIX}{stamp}-{os.getpid()}")
    if len(run_dir) + len(LONGEST_SOCKET) > MAX_SOCKET_PATH:
        raise Refusal(
            f"refused: --ssd-dir {ssd_dir} is too long: the Unix sockets of the runs under it "
            f"({run_dir}{LONGEST_SOCKET}) would exceed {MAX_SOCKET_PATH} bytes; use a shorter path"
        )
    try:
        os.mkdir(run_dir, 0o700)
    except OSError as e:
        raise Refusal(f"refused: cannot create the private run directory {run_dir}: {e.strerror}") from None
    for sub in ("logs", "data", "data/tmp", "results"):
        os.mkdir(os.path.join(run_dir, sub), 0o700)
    cufile_json = os.path.join(run_dir, "cufile.json")
    cufile_config.write_private(source, cufile_json, os.path.join(run_dir, "logs"))
    problem = cufile_config.check_written(cufile_json)
    if problem:
        raise Refusal(f"refused: {problem}")
    env = child_environment(environ, cufile_json, artifacts, run_dir)
    # 5. What cuFile itself loads from the private file (gdscheck -p is a read-only probe).
    try:
        p = subprocess.run(tools["gdscheck"] + ["-p"], capture_output=True, text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Refusal(f"refused: gdscheck -p did not run: {e}") from None
    text = p.stdout + p.stderr
    with open(os.path.join(run_dir, "logs", "gdscheck-preflight.log"), "w", encoding="utf-8") as f:
        f.write(text)
    try:
        check = evidence.parse_gdscheck(text)
    except evidence.FormatError as e:
        raise Refusal(f"refused: gdscheck -p (exit {p.returncode}) output not understood: {e}; compatibility mode cannot be verified") from None
    problem = evidence.compat_problem(check)
    if problem:
        raise Refusal(f"refused: compatibility mode is not disabled: {problem} with {cufile_json}")
    return Prepared(
        ssd_dir=ssd_dir,
        storage=storage,
        tools=tools,
        artifacts=artifacts,
        run_dir=run_dir,
        cufile_json=cufile_json,
        cufile_source=source,
        gdscheck_text=text,
        env=env,
        virtualization=found,
    )


def child_environment(environ: dict, cufile_json: str, artifacts: dict, run_dir: str) -> dict:
    env = dict(environ)
    env[cufile_config.ENV_PATH] = cufile_json
    for var in COMPAT_ENV:
        env[var] = "false"
    if artifacts.get("cufile_library"):
        env["ORBITKV_CUFILE_LIBRARY"] = artifacts["cufile_library"]
    env["TMPDIR"] = os.path.join(run_dir, "data", "tmp")
    # Bundles (tests/gpu/gpu_host_tests.sh bundle) carry spdlog/fmt beside the executables.
    dirs = []
    for key in ("manager", "core_test", "cuda_engine"):
        if artifacts.get(key):
            d = os.path.dirname(artifacts[key])
            if d not in dirs:
                dirs.append(d)
    if environ.get("LD_LIBRARY_PATH"):
        dirs.append(environ["LD_LIBRARY_PATH"])
    if dirs:
        env["LD_LIBRARY_PATH"] = ":".join(dirs)
    return env
