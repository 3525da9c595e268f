"""Parsers for NVIDIA's GDS tools' text output, and the rules that decide
whether it shows native GPUDirect Storage.

 * gds_stats -p PID -l 3: per-process cuFile statistics (STATS VERSION 3 and
   later: the older "Total Read Errors : N" global block and the newer
   "Read: ok = N err = M" one; per-GPU lines with or without a UUID).
 * gdsio: its one-line summary per run.
 * gdscheck.py -p: the driver configuration (which storage types have a
   native route) and the cuFile properties it loaded.

Parsers raise FormatError on text they do not understand: unknown output is
never read as zero.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional


class FormatError(ValueError):
    pass


def _snake(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise FormatError(f"not a number: {text!r}") from None
    return int(v) if v.is_integer() else v


_SECTION_HEADERS = {
    "GLOBAL STATS:": "global",
    "READ-WRITE SIZE HISTOGRAM :": "histogram",
    "READ-WRITE SIZE HISTOGRAM:": "histogram",
    "PER_GPU STATS:": "per_gpu",
    "PER_GPU POOL BUFFER STATS:": "pool",
    "PER_GPU POSIX POOL BUFFER STATS:": "posix_pool",
    "PER_GPU RDMA STATS:": "rdma",
    "RDMA MRSTATS:": "rdma_mr",
    "PER NUMA NODE THREAD POOL STATS:": "threads",
}
_GPU_LINE = re.compile(
    r"^GPU\s+(?P<gpu>[0-9A-Fa-f:.]+)\s*(?:\(UUID:\s*(?P<uuid>[^)]*)\))?\s+"
    r"Read:(?P<read>.*?)\s+Write:(?P<write>.*?)(?:\s+BufRegister:(?P<buf>.*))?$"
)
_FIELD = re.compile(r"([A-Za-z_][\w%()]*)=(\S+)")
# Every per-GPU counter the success rules read; a level-3 line without one of
# them is an unknown format.
READ_KEYS = ("n", "posix", "unalign", "r_sparse", "r_inline", "err", "MiB")
WRITE_KEYS = ("n", "posix", "unalign", "err", "MiB")


def _fields(text: str) -> dict:
    return {k: _number(v) for k, v in _FIELD.findall(text)}


@dataclasses.dataclass
class GdsStats:
    version: int
    global_stats: dict
    per_gpu: list  # [{"gpu", "uuid", "read": {...}, "write": {...}, "buf_register": {...}}]
    sections: list  # section names seen, in order


def parse_gds_stats(text: str) -> GdsStats:
    """The last complete report in `text` (gds_stats output, possibly several
    captures appended). Raises FormatError when there is none."""
    starts = [m.start() for m in re.finditer(r"^cuFile STATS VERSION\s*:", text, re.M)]
    if not starts:
        raise FormatError("no 'cuFile STATS VERSION' line: not gds_stats output")
    errors = []
    for start in reversed(starts):
        end = next((s for s in starts if s > start), len(text))
        try:
            return _parse_one(text[start:end])
        except FormatError as e:
            errors.append(str(e))
    raise FormatError(errors[0])


def _parse_one(text: str) -> GdsStats:
    lines = text.splitlines()
    m = re.match(r"cuFile STATS VERSION\s*:\s*(\d+)\s*$", lines[0].strip())
    if not m:
        raise FormatError(f"bad version line {lines[0]!r}")
    stats = GdsStats(int(m.group(1)), {}, [], [])
    section = None
    for raw in lines[1:]:
        line = raw.strip()
        if not line:
            continue
        if line in _SECTION_HEADERS:
            section = _SECTION_HEADERS[line]
            stats.sections.append(section)
            continue
        if section == "global":
            ok = re.match(r"^(\w+):\s*ok\s*=\s*(\S+)\s+err\s*=\s*(\S+)$", line)
            if ok:  # "Read: ok = 13616 err = 0" (version 4 and later)
                key = _snake(re.sub(r"(?<=[a-z])(?=[A-Z])", "_", ok.group(1)))
                stats.global_stats[f"{key}_ok"] = _number(ok.group(2))
                stats.global_stats[f"{key}_err"] = _number(ok.group(3))
                continue
            kv = re.match(r"^(.*?)\s*:\s*(\S+)$", line)
            if not kv:
                raise FormatError(f"unknown GLOBAL STATS line {line!r}")
            stats.global_stats[_snake(kv.group(1))] = _number(kv.group(2))
        elif section == "per_gpu":
            g = _GPU_LINE.match(line)
            if not g:
                raise FormatError(f"unknown PER_GPU STATS line {line!r}")
            entry = {
                "gpu": g.group("gpu"),
                "uuid": (g.group("uuid") or "").strip() or None,
                "read": _fields(g.group("read")),
                "write": _fields(g.group("write")),
                "buf_register": _fields(g.group("buf") or ""),
            }
            for side, keys in (("read", READ_KEYS), ("write", WRITE_KEYS)):
                missing = [k for k in keys if k not in entry[side]]
                if missing:
                    raise FormatError(
                        f"GPU {entry['gpu']} {side} statistics lack {', '.join(missing)}: {line!r}"
                    )
            stats.per_gpu.append(entry)
    if "global" not in stats.sections:
        raise FormatError("no GLOBAL STATS section")
    return stats


@dataclasses.dataclass
class Verdict:
    ok: bool
    reasons: list  # why not (empty when ok)
    summary: dict  # the counters the rules read


def judge_native(
    stats: Optional[GdsStats], require_reads: bool = True, require_writes: bool = True
) -> Verdict:
    """The spec's native-path rule: positive reads and writes (as required) and
    zero POSIX, unaligned, sparse/inline and failed operations. Missing
    statistics (None), or a report without per-GPU statistics, fail."""
    if stats is None:
        return Verdict(False, ["no cuFile statistics for the process"], {})
    if "per_gpu" not in stats.sections or not stats.per_gpu:
        return Verdict(
            False,
            ["no PER_GPU STATS in the report (cufile_stats below 3, or gds_stats without -l 3)"],
            {"version": stats.version},
        )
    s = {
        "version": stats.version,
        "read_ops": sum(g["read"]["n"] for g in stats.per_gpu),
        "write_ops": sum(g["write"]["n"] for g in stats.per_gpu),
        "read_mib": sum(g["read"]["MiB"] for g in stats.per_gpu),
        "write_mib": sum(g["write"]["MiB"] for g in stats.per_gpu),
        "posix_ops": sum(g["read"]["posix"] + g["write"]["posix"] for g in stats.per_gpu),
        "unaligned_ops": sum(g["read"]["unalign"] + g["write"]["unalign"] for g in stats.per_gpu),
        "sparse_reads": sum(g["read"]["r_sparse"] for g in stats.per_gpu),
        "inline_reads": sum(g["read"]["r_inline"] for g in stats.per_gpu),
        "failed_ops": sum(g["read"]["err"] + g["write"]["err"] for g in stats.per_gpu),
        "buffer_register_errors": sum(g["buf_register"].get("err", 0) for g in stats.per_gpu),
        "dynamic_routing_ops": sum(
            g["read"].get("dr", 0) + g["write"].get("dr", 0) for g in stats.per_gpu
        ),
    }
    g = stats.global_stats
    s["global_errors"] = sum(
        v for k, v in g.items() if k.endswith("_err") or k.endswith("_errors")
    )
    s["posix_batch_ops"] = sum(v for k, v in g.items() if k.startswith("posix_") and k.endswith("_ok"))
    reasons = []
    if require_reads and s["read_ops"] <= 0:
        reasons.append("no cuFile reads")
    if require_writes and s["write_ops"] <= 0:
        reasons.append("no cuFile writes")
    for key, what in (
        ("posix_ops", "POSIX (compatibility) operations"),
        ("posix_batch_ops", "POSIX batch operations"),
        ("unaligned_ops", "unaligned operations"),
        ("sparse_reads", "sparse reads"),
        ("inline_reads", "inline reads"),
        ("failed_ops", "failed operations"),
        ("buffer_register_errors", "buffer registration errors"),
        ("global_errors", "errors in GLOBAL STATS"),
    ):
        if s[key]:
            reasons.append(f"{s[key]} {what}")
    return Verdict(not reasons, reasons, s)


_GDSIO = re.compile(
    r"IoType:\s*(?P<io>\S+)\s+XferType:\s*(?P<xfer>\S+)\s+Threads:\s*(?P<threads>\d+)\s+"
    r"DataSetSize:\s*(?P<dataset>\S+)\s+IOSize:\s*(?P<iosize>\S+)\s+"
    r"Throughput:\s*(?P<gib>[\d.]+)\s*GiB/sec,\s*Avg_Latency:\s*(?P<lat>[\d.]+)\s*usecs\s+"
    r"ops:\s*(?P<ops>\d+)\s+total_time\s+(?P<secs>[\d.]+)\s*secs"
)


def parse_gdsio(text: str) -> dict:
    """gdsio's summary line: io type, transfer type, throughput, latency, ops."""
    m = None
    for m in _GDSIO.finditer(text):
        pass
    if m is None:
        raise FormatError("no gdsio summary line (IoType: ... Throughput: ...)")
    return {
        "io_type": m.group("io"),
        "xfer_type": m.group("xfer"),
        "threads": int(m.group("threads")),
        "dataset": m.group("dataset"),
        "io_size": m.group("iosize"),
        "throughput_gib_s": float(m.group("gib")),
        "avg_latency_us": float(m.group("lat")),
        "ops": int(m.group("ops")),
        "total_time_s": float(m.group("secs")),
    }


@dataclasses.dataclass
class GdsCheck:
    drivers: dict  # {"NVMe": "Supported", "NVMeOF": "Unsupported", ...}
    properties: dict  # {"properties.allow_compat_mode": "false", ...}
    platform_ok: Optional[bool]  # "Platform verification succeeded" / "... error"
    versions: dict


_BOOL_WORDS = {"true": True, "1": True, "false": False, "0": False}


def parse_gdscheck(text: str) -> GdsCheck:
    drivers: dict = {}
    props: dict = {}
    versions: dict = {}
    platform_ok = None
    for raw in text.splitlines():
        line = raw.strip()
        if re.match(r"^Platform verification succeeded", line):
            platform_ok = True
            continue
        if re.match(r"^Platform verification (error|failed)", line, re.I):
            platform_ok = False
            continue
        v = re.match(r"^GDS release version(?: \(beta\))?\s*:\s*(\S+)", line)
        if v:
            versions["gds"] = v.group(1)
            continue
        v = re.match(r"^nvidia_fs version:\s*(\S+)\s+libcufile version:\s*(\S+)", line)
        if v:
            versions["nvidia_fs"], versions["libcufile"] = v.group(1), v.group(2)
            continue
        kv = re.match(r"^((?:properties|fs|profile|execution|logging|miscellaneous)\.[\w.]+)\s*:\s*(.*)$", line)
        if kv:
            props[kv.group(1)] = kv.group(2).strip()
            continue
        d = re.match(r"^(NVMe P2PDMA|NVMe|NVMeOF|SCSI|ScaleFlux CSD|SCALEFLUX CSD|NVMesh|DDN EXAScaler|IBM Spectrum Scale|LUSTRE|NFS|BeeGFS|WekaFS|WEKAFS|Userspace RDMA|USERSPACE RDMA|GPFS|VIRTIOFS)\s*:\s*(.+)$", line)
        if d:
            drivers[d.group(1)] = d.group(2).strip()
    if not drivers and not props:
        raise FormatError("no driver configuration or cuFile properties: not gdscheck -p output")
    return GdsCheck(drivers, props, platform_ok, versions)


def property_bool(check: GdsCheck, *names: str) -> Optional[bool]:
    """The first of `names` that gdscheck reported, as a bool (None: none reported
    or not a boolean)."""
    for n in names:
        if n in check.properties:
            return _BOOL_WORDS.get(check.properties[n].lower())
    return None


def compat_problem(check: GdsCheck) -> Optional[str]:
    """Why cuFile's configuration, as gdscheck loaded it, still allows or forces
    compatibility mode (None: disabled)."""
    allow = property_bool(check, "properties.allow_compat_mode", "properties.use_compat_mode")
    force = property_bool(check, "properties.force_compat_mode")
    if allow is None:
        return "gdscheck -p reports neither properties.allow_compat_mode nor properties.use_compat_mode"
    if allow:
        return "gdscheck -p reports compatibility mode allowed"
    if force:
        return "gdscheck -p reports properties.force_compat_mode true"
    return None


def nvme_native_problem(check: GdsCheck) -> Optional[str]:
    """Why gdscheck shows no native NVMe route (None: it shows one)."""
    value = check.drivers.get("NVMe")
    if value is None:
        return "gdscheck -p has no NVMe line"
    routes = {w.strip().lower() for w in value.split(",")}
    p2pdma = check.drivers.get("NVMe P2PDMA", "").strip().lower() == "supported"
    if p2pdma or "supported" in routes or routes & {"nvfs", "p2pdma", "p2p", "native"}:
        if check.platform_ok is False:
            return "gdscheck -p: platform verification failed"
        return None
    return f"gdscheck -p: NVMe : {value} (no native route)"
