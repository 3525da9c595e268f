"""What kind of host this is, and what backs a directory: the refusal checks of
benches.gds that need no GPU tool.

Every function takes `root`, the directory that stands for "/" (the real root
in production, a fake tree in tests), and reads only below it. Nothing here
writes anything or needs privileges.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from typing import Callable, Optional

# DMI strings (product_name, sys_vendor, board_vendor, bios_vendor) that only
# hypervisors report. Matched case-insensitively as substrings. "Amazon EC2" is
# not here: EC2 bare-metal instances report it too; the cpuinfo hypervisor
# flag tells those apart.
_VM_DMI_MARKERS = (
    "firecracker",
    "qemu",
    "kvm",
    "virtualbox",
    "vmware",
    "xen",
    "bochs",
    "parallels",
    "cloud hypervisor",
    "bhyve",
    "virtual machine",  # Microsoft Hyper-V's product_name
    "google compute engine",
)
_DMI_FILES = ("product_name", "sys_vendor", "board_vendor", "bios_vendor")
# Words in /proc/1/cgroup that name a container runtime.
_CGROUP_MARKERS = ("docker", "kubepods", "containerd", "libpod", "lxc", "crio", "podman", "garden")


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # "container" or "vm"
    evidence: str


def _read(root: str, path: str) -> Optional[str]:
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _exists(root: str, path: str) -> bool:
    return os.path.lexists(os.path.join(root, path.lstrip("/")))


def run_detect_virt(binary: str) -> Optional[str]:
    """systemd-detect-virt's answer ("none", "kvm", "docker", ...), or None when it cannot run."""
    try:
        p = subprocess.run([binary], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = p.stdout.strip()
    return out or None


def detect_virtualization(
    root: str = "/",
    detect_virt: Optional[Callable[[], Optional[str]]] = None,
) -> list[Finding]:
    """Every sign that this is a container or a virtual machine (empty on bare metal).

    `detect_virt` returns systemd-detect-virt's output (None: not installed or
    failed); the default runs it when root is "/" and it is on PATH.
    """
    found: list[Finding] = []
    for marker in ("/.dockerenv", "/run/.containerenv"):
        if _exists(root, marker):
            found.append(Finding("container", f"{marker} exists"))
    cgroup = _read(root, "/proc/1/cgroup")
    if cgroup:
        for line in cgroup.splitlines():
            low = line.lower()
            hit = next((m for m in _CGROUP_MARKERS if m in low), None)
            if hit:
                found.append(Finding("container", f"/proc/1/cgroup names {hit}: {line.strip()}"))
                break
    environ = _read(root, "/proc/1/environ")
    if environ:
        for var in environ.split("\0"):
            if var.startswith("container="):
                found.append(Finding("container", f"/proc/1/environ has {var}"))
    mountinfo = _read(root, "/proc/self/mountinfo")
    if mountinfo:
        for m in parse_mountinfo(mountinfo):
            if m.mount_point == "/" and m.fstype in ("overlay", "aufs", "fuse-overlayfs"):
                found.append(Finding("container", f"the root file system is {m.fstype}"))
    if detect_virt is None and root == "/":
        from shutil import which

        binary = which("systemd-detect-virt")
        if binary:
            detect_virt = lambda: run_detect_virt(binary)  # noqa: E731
    if detect_virt is not None:
        answer = detect_virt()
        if answer and answer != "none":
            found.append(Finding("vm-or-container", f"systemd-detect-virt says {answer}"))
    for name in _DMI_FILES:
        value = _read(root, f"/sys/class/dmi/id/{name}")
        if value is None:
            continue
        value = value.strip()
        low = value.lower()
        hit = next((m for m in _VM_DMI_MARKERS if m in low), None)
        if hit:
            found.append(Finding("vm", f"/sys/class/dmi/id/{name} is {value!r}"))
    cpuinfo = _read(root, "/proc/cpuinfo")
    if cpuinfo:
        for line in cpuinfo.splitlines():
            key, _, flags = line.partition(":")
            if key.strip() in ("flags", "Features") and "hypervisor" in flags.split():
                found.append(Finding("vm", "/proc/cpuinfo has the hypervisor flag"))
                break
    hv = _read(root, "/sys/hypervisor/type")
    if hv and hv.strip():
        found.append(Finding("vm", f"/sys/hypervisor/type is {hv.strip()!r}"))
    try:
        virtio = sorted(os.listdir(os.path.join(root, "sys/bus/virtio/devices")))
    except OSError:
        virtio = []
    if virtio:
        found.append(Finding("vm", f"virtio devices present ({', '.join(virtio[:4])})"))
    return found


@dataclasses.dataclass(frozen=True)
class Mount:
    mount_point: str
    major_minor: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of /proc/<pid>/mountinfo, in file order (later ones shadow earlier)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        mounts.append(
            Mount(
                mount_point=_unescape(fields[4]),
                major_minor=fields[2],
                fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]),
            )
        )
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Optional[Mount]:
    """The mount that holds `path` (absolute, symlinks resolved): the longest
    mount point that is a prefix of it, the last one listed when stacked."""
    best: Optional[Mount] = None
    best_len = -1
    for m in mounts:
        mp = m.mount_point.rstrip("/")
        if mp == "" or path == mp or path.startswith(mp + "/"):
            if len(mp) >= best_len:
                best, best_len = m, len(mp)
    return best


@dataclasses.dataclass
class BlockDevice:
    name: str  # kernel name: nvme0n1, vda, sda
    sysfs_path: str  # resolved /sys/devices/... path (under root)
    nvme: bool
    detail: str  # driver / transport / why not NVMe


def _device_driver(dev_dir: str) -> Optional[str]:
    link = os.path.join(dev_dir, "device", "driver")
    try:
        return os.path.basename(os.path.realpath(link)) if os.path.lexists(link) else None
    except OSError:
        return None


def _read_abs(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _nvme_transport(root: str, dev_dir: str) -> Optional[str]:
    """The NVMe controller's transport (pcie, rdma, tcp, fc, loop) of a namespace."""
    parts = dev_dir.split(os.sep)
    if "nvme" in parts:  # .../nvme/nvme0/nvme0n1
        i = parts.index("nvme")
        if i + 1 < len(parts):
            return _read_abs(os.path.join(os.sep.join(parts[: i + 2]), "transport"))
    m = re.match(r"nvme(\d+)(?:c\d+)?n\d+$", os.path.basename(dev_dir))
    if m:  # multipath head under nvme-subsystem: ask the controller by number
        return _read_abs(os.path.join(root, f"sys/class/nvme/nvme{m.group(1)}/transport"))
    return None


def leaf_devices(root: str, major_minor: str) -> list[BlockDevice]:
    """The physical block devices behind device MAJ:MIN: a partition resolves to
    its disk; device-mapper and md devices resolve through their slaves.

    Raises ValueError when sysfs does not know the device.
    """
    link = os.path.join(root, "sys/dev/block", major_minor)
    if not os.path.lexists(link):
        raise ValueError(f"no /sys/dev/block/{major_minor}: not a block device")
    return _leaves(root, os.path.realpath(link), depth=0)


def _leaves(root: str, dev_dir: str, depth: int) -> list[BlockDevice]:
    if depth > 8:
        raise ValueError(f"block device stack deeper than 8 at {dev_dir}")
    if os.path.exists(os.path.join(dev_dir, "partition")):
        dev_dir = os.path.dirname(dev_dir)
    name = os.path.basename(dev_dir)
    slaves_dir = os.path.join(dev_dir, "slaves")
    try:
        slaves = sorted(os.listdir(slaves_dir))
    except OSError:
        slaves = []
    if slaves:
        out: list[BlockDevice] = []
        for s in slaves:
            out.extend(_leaves(root, os.path.realpath(os.path.join(slaves_dir, s)), depth + 1))
        return out
    is_nvme_name = re.match(r"nvme\d+(c\d+)?n\d+$", name) is not None
    in_nvme_tree = f"{os.sep}nvme{os.sep}" in dev_dir or "nvme-subsystem" in dev_dir
    driver = _device_driver(dev_dir)
    if is_nvme_name or in_nvme_tree:
        transport = _nvme_transport(root, dev_dir)
        if transport == "loop":
            return [BlockDevice(name, dev_dir, False, "NVMe loop target (software, no device)")]
        return [BlockDevice(name, dev_dir, True, f"NVMe, transport {transport or 'unknown'}")]
    if name.startswith("vd") or "virtio" in dev_dir:
        why = "virtio disk"
    elif name.startswith(("loop", "zram", "ram", "nbd")):
        why = f"{re.sub(r'[0-9]+$', '', name)} device"
    else:
        why = f"driver {driver}" if driver else "not NVMe"
    return [BlockDevice(name, dev_dir, False, why)]


@dataclasses.dataclass
class StorageCheck:
    path: str
    mount: Optional[Mount]
    devices: list[BlockDevice]
    problem: Optional[str]  # None: ext4/XFS on NVMe only


def check_storage(path: str, root: str = "/") -> StorageCheck:
    """Whether `path` (a directory, already resolved) sits on ext4 or XFS whose
    every backing device is NVMe. `path` is as seen from `root`."""
    mountinfo = _read(root, "/proc/self/mountinfo")
    if mountinfo is None:
        return StorageCheck(path, None, [], "cannot read /proc/self/mountinfo")
    m = mount_of(path, parse_mountinfo(mountinfo))
    if m is None:
        return StorageCheck(path, None, [], f"no mount holds {path}")
    where = f"{path} is on {m.source} mounted at {m.mount_point} ({m.fstype})"
    if m.fstype not in ("ext4", "xfs"):
        return StorageCheck(path, m, [], f"{where}: native GDS qualification needs ext4 or XFS")
    try:
        devices = leaf_devices(root, m.major_minor)
    except ValueError as e:
        return StorageCheck(path, m, [], f"{where}: {e}")
    bad = [d for d in devices if not d.nvme]
    if bad:
        names = ", ".join(f"{d.name} ({d.detail})" for d in bad)
        return StorageCheck(path, m, devices, f"{where}, which is not NVMe-backed: {names}")
    return StorageCheck(path, m, devices, None)
