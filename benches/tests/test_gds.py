"""Source-level tests of benches.gds (spec "Bare-metal acceptance script"):
every refusal against fake sysfs/proc trees and fake tools, the gds_stats,
gdsio and gdscheck parsers on realistic output, the native success rules, and
a whole run's qualification.json. No GPU, GDS or root needed."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benches.gds import __main__ as gds_main  # noqa: E402
from benches.gds import cufile_config, evidence, host, preflight, procs, stages  # noqa: E402
from benches.tests import fakes  # noqa: E402


# ------------------------------------------------------------------ helpers


@pytest.fixture
def tmp_path():
    """A short temporary directory: the runs put Unix sockets (107 bytes at most) under it."""
    d = tempfile.mkdtemp(prefix="gds", dir="/tmp")
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def env(tmp_path):
    """A bare-metal fake root whose --ssd-dir is ext4 on nvme0n1p1, fake tools,
    and the command line that uses them."""
    ssd = tmp_path / "nvme"
    ssd.mkdir()
    root = str(tmp_path / "root")
    fakes.bare_metal(root, str(ssd.resolve()))
    t = fakes.tools(str(tmp_path / "host"))
    argv = ["--ssd-dir", str(ssd), "--model", t["model"], "--manager", t["manager"],
            "--fault-manager", t["fault_manager"], "--core-test", t["core_test"],
            "--gds-tools", t["gds_tools"], "--cufile-library", t["cufile_library"],
            "--sample-interval", "0.25"]
    environ = {"PATH": t["bin"] + ":/usr/bin:/bin", "FAKE_FIXTURES": fakes.FIXTURES,
               "FAKE_RUN_PREFIX": str(ssd.resolve()), "HOME": str(tmp_path)}
    return types.SimpleNamespace(root=root, ssd=ssd, tools=t, argv=argv, environ=environ, tmp=tmp_path)


def refusal(env, argv=None, environ=None, detect_virt=lambda: "none", root=None) -> str:
    args = gds_main.parse_args(env.argv if argv is None else argv)
    with pytest.raises(preflight.Refusal) as e:
        preflight.preflight(args, root=root or env.root, environ=env.environ if environ is None else environ,
                            detect_virt=detect_virt)
    msg = str(e.value)
    assert msg.startswith("refused: ") and "\n" not in msg
    return msg


def run_dirs(ssd) -> list:
    return sorted(p for p in os.listdir(ssd) if p.startswith(preflight.RUN_DIR_PREFIX))


# ------------------------------------------------------------------ virtualization


def test_bare_metal_tree_has_no_virtualization_findings(env):
    assert host.detect_virtualization(env.root, lambda: "none") == []


@pytest.mark.parametrize("setup, evidence_text", [
    (lambda r: fakes.write(f"{r}/.dockerenv", ""), "/.dockerenv exists"),
    (lambda r: fakes.write(f"{r}/run/.containerenv", ""), "/run/.containerenv exists"),
    (lambda r: fakes.write(f"{r}/proc/1/cgroup", "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n"),
     "/proc/1/cgroup names kubepods"),
    (lambda r: fakes.write(f"{r}/proc/1/cgroup", "12:pids:/docker/3f1b\n0::/docker/3f1b\n"), "names docker"),
    (lambda r: fakes.write(f"{r}/proc/1/environ", "container=podman\0HOME=/\0"), "container=podman"),
])
def test_containers_are_refused(env, setup, evidence_text):
    setup(env.root)
    msg = refusal(env)
    assert "container" in msg and evidence_text in msg and "bare metal" in msg
    assert run_dirs(env.ssd) == []


def test_overlay_root_is_a_container(env):
    info = open(f"{env.root}/proc/self/mountinfo").read()
    fakes.write(f"{env.root}/proc/self/mountinfo",
                info.replace("1 0 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw",
                             "1 0 0:45 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u"))
    assert "the root file system is overlay" in refusal(env)


def firecracker(root):
    """What the project's H200 host shows: a Firecracker microVM (no DMI, the
    hypervisor CPU flag, virtio devices), seen from inside its container."""
    for f in ("product_name", "sys_vendor"):
        os.unlink(f"{root}/sys/class/dmi/id/{f}")
    fakes.write(f"{root}/proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu vme de pse tsc hypervisor lahf_lm\n")
    for i in range(3):
        os.makedirs(f"{root}/sys/bus/virtio/devices/virtio{i}")


def test_firecracker_microvm_is_refused(env):
    firecracker(env.root)
    msg = refusal(env)
    assert "virtual machine" in msg
    assert "/proc/cpuinfo has the hypervisor flag" in msg and "virtio devices present (virtio0" in msg


@pytest.mark.parametrize("name, value", [
    ("sys_vendor", "QEMU"), ("product_name", "KVM"), ("sys_vendor", "Firecracker"),
    ("product_name", "VMware Virtual Platform"), ("product_name", "Virtual Machine"),
    ("product_name", "Google Compute Engine"), ("sys_vendor", "innotek GmbH VirtualBox"),
])
def test_hypervisor_dmi_strings_are_refused(env, name, value):
    fakes.write(f"{env.root}/sys/class/dmi/id/{name}", value + "\n")
    assert f"/sys/class/dmi/id/{name} is {value!r}" in refusal(env)


def test_ec2_bare_metal_dmi_alone_is_not_a_vm(env):
    fakes.write(f"{env.root}/sys/class/dmi/id/sys_vendor", "Amazon EC2\n")
    fakes.write(f"{env.root}/sys/class/dmi/id/product_name", "p5.48xlarge.metal\n")
    assert host.detect_virtualization(env.root, lambda: "none") == []


def test_systemd_detect_virt_answer_is_used(env, tmp_path):
    assert "systemd-detect-virt says kvm" in refusal(env, detect_virt=lambda: "kvm")
    none = fakes.script(str(tmp_path / "sdv-none"), "import sys; print('none'); sys.exit(1)\n")
    microvm = fakes.script(str(tmp_path / "sdv-kvm"), "print('kvm')\n")
    assert host.run_detect_virt(none) == "none"
    assert host.run_detect_virt(microvm) == "kvm"
    assert host.run_detect_virt(str(tmp_path / "absent")) is None


def test_xen_hypervisor_type_is_refused(env):
    fakes.write(f"{env.root}/sys/hypervisor/type", "xen\n")
    assert "/sys/hypervisor/type is 'xen'" in refusal(env)


# ------------------------------------------------------------------ storage


def remount(env, fstype="ext4", majmin="259:1", target=fakes.NVME_PART):
    fakes.bare_metal(env.root, str(env.ssd.resolve()), fstype, majmin, target)


@pytest.mark.parametrize("fstype", ["tmpfs", "btrfs", "overlay", "nfs4", "zfs"])
def test_mounts_other_than_ext4_or_xfs_are_refused(env, fstype):
    remount(env, fstype=fstype, majmin="0:52")
    msg = refusal(env)
    assert f"({fstype}): native GDS qualification needs ext4 or XFS" in msg


def test_xfs_on_nvme_is_accepted(env):
    remount(env, fstype="xfs")
    c = host.check_storage(str(env.ssd.resolve()), env.root)
    assert c.problem is None and [d.name for d in c.devices] == ["nvme0n1"]
    assert c.devices[0].detail == "NVMe, transport pcie"


def test_virtio_disk_is_refused(env):
    remount(env, majmin="254:1", target=fakes.VIRTIO_DISK + "/vda1")
    msg = refusal(env)
    assert "not NVMe-backed: vda (virtio disk)" in msg


def test_sata_disk_is_refused_with_its_driver(env):
    os.makedirs(f"{env.root}/sys/bus/scsi/drivers/sd")
    fakes.link(env.root, "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/driver",
               "../../../../../../../bus/scsi/drivers/sd")
    fakes.link(env.root, "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda/device",
               "../../../0:0:0:0")
    remount(env, majmin="8:1", target=fakes.SATA_PART)
    assert "not NVMe-backed: sda (driver sd)" in refusal(env)


def test_device_mapper_resolves_through_its_slaves(env):
    dm = "devices/virtual/block/dm-0"
    fakes.sys_block(env.root, "253:0", dm)
    fakes.sys_block(env.root, "259:1", fakes.NVME_PART)
    fakes.link(env.root, f"sys/{dm}/slaves/nvme0n1p1", f"../../../../{fakes.NVME_PART[len('devices/'):]}")
    remount(env, majmin="253:0", target=dm)
    c = host.check_storage(str(env.ssd.resolve()), env.root)
    assert c.problem is None and [d.name for d in c.devices] == ["nvme0n1"]
    # A second slave on SATA makes the volume not NVMe-backed.
    fakes.sys_block(env.root, "8:1", fakes.SATA_PART)
    fakes.link(env.root, f"sys/{dm}/slaves/sda1", f"../../../../{fakes.SATA_PART[len('devices/'):]}")
    c = host.check_storage(str(env.ssd.resolve()), env.root)
    assert "not NVMe-backed: sda" in c.problem and "nvme0n1" not in c.problem


def test_md_raid_of_two_nvme_namespaces_is_accepted(env):
    md = "devices/virtual/block/md127"
    fakes.sys_block(env.root, "9:127", md)
    for disk, tgt in (("nvme0n1p1", fakes.NVME_PART), ("nvme1n1", fakes.NVME1_DISK)):
        fakes.sys_block(env.root, "259:9", tgt)
        fakes.link(env.root, f"sys/{md}/slaves/{disk}", f"../../../../{tgt[len('devices/'):]}")
    remount(env, majmin="9:127", target=md)
    c = host.check_storage(str(env.ssd.resolve()), env.root)
    assert c.problem is None and sorted(d.name for d in c.devices) == ["nvme0n1", "nvme1n1"]


def test_nvme_loop_target_is_not_a_device(env):
    fakes.write(f"{env.root}/sys/devices/pci0000:00/0000:00:01.1/0000:3b:00.0/nvme/nvme0/transport", "loop\n")
    assert "NVMe loop target" in refusal(env)


def test_unknown_block_device_is_refused(env):
    info = open(f"{env.root}/proc/self/mountinfo").read().replace(" 259:1 ", " 259:77 ")
    fakes.write(f"{env.root}/proc/self/mountinfo", info)
    assert "no /sys/dev/block/259:77" in refusal(env)


def test_mountinfo_escapes_and_stacked_mounts():
    text = ("1 0 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
            "40 1 259:1 / /mnt/fast\\040disk rw shared:3 master:1 - xfs /dev/nvme0n1p1 rw\n"
            "41 40 0:60 / /mnt/fast\\040disk rw - tmpfs tmpfs rw\n")
    mounts = host.parse_mountinfo(text)
    assert mounts[1].mount_point == "/mnt/fast disk" and mounts[1].fstype == "xfs"
    # The later mount on the same point shadows the earlier one.
    assert host.mount_of("/mnt/fast disk/q", mounts).fstype == "tmpfs"
    assert host.mount_of("/mnt/fast diskette", mounts).fstype == "ext4"
    assert host.mount_of("/", mounts).source == "/dev/nvme0n1p2"


def test_ssd_dir_must_be_an_existing_directory_never_a_device(env):
    base = env.argv[:]
    i = base.index("--ssd-dir")
    for path, expected in (("/dev/null", "is a device"), (str(env.tmp / "absent"), "No such file"),
                           (fakes.write(str(env.tmp / "file"), "x"), "is not a directory")):
        argv = base[:i + 1] + [path] + base[i + 2:]
        assert expected in refusal(env, argv)


def test_refusal_names_the_host_device_on_this_kind_of_vm(env):
    # /dev/vda mounted at / as on the project's VMs, without any other VM sign.
    fakes.write(f"{env.root}/proc/self/mountinfo", "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n")
    fakes.sys_block(env.root, "254:0", fakes.VIRTIO_DISK)
    assert refusal(env).endswith("is on /dev/vda mounted at / (ext4), which is not NVMe-backed: vda (virtio disk)")


# ------------------------------------------------------------------ tools and compatibility mode


@pytest.mark.parametrize("victim, expected", [
    ("gds_stats", "gds_stats in"), ("gdsio", "gdsio in"), ("gdscheck", "gdscheck.py in"),
    ("cufile_library", "--cufile-library"), ("manager", "--manager"), ("fault_manager", "--fault-manager"),
    ("core_test", "--core-test"), ("bench", "--bench"), ("cuda_engine", "--cuda-engine"),
])
def test_missing_tools_and_artifacts_are_refused(env, victim, expected):
    os.unlink(env.tools[victim])
    msg = refusal(env)
    assert "missing or not executable" in msg and expected in msg
    assert run_dirs(env.ssd) == []


def test_a_tool_that_is_not_executable_is_refused(env):
    os.chmod(env.tools["gdsio"], 0o644)
    assert "gdsio in" in refusal(env)


@pytest.mark.parametrize("var", preflight.COMPAT_ENV)
def test_compat_mode_in_the_environment_is_refused(env, var):
    assert f"{var}=true in the environment" in refusal(env, environ=dict(env.environ, **{var: "true"}))


def test_compat_mode_still_on_after_the_overlay_is_refused(env):
    # gdscheck reports what cuFile loaded: here a library that ignores the private file.
    msg = refusal(env, environ=dict(env.environ, FAKE_GDSCHECK_COMPAT="1"))
    assert msg.startswith("refused: compatibility mode is not disabled: gdscheck -p reports compatibility mode allowed")


def test_no_cufile_json_is_refused(env):
    os.unlink(os.path.join(env.tools["gds_tools"], "..", "cuda", "gds", "cufile.json"))
    assert "no cufile.json to copy" in refusal(env)


def test_preflight_passes_and_leaves_the_system_config_untouched(env):
    source = os.path.join(env.tools["gds_tools"], "..", "cuda", "gds", "cufile.json")
    before = open(source, "rb").read()
    args = gds_main.parse_args(env.argv)
    p = preflight.preflight(args, root=env.root, environ=env.environ, detect_virt=lambda: "none")
    assert open(source, "rb").read() == before
    assert os.path.dirname(p.run_dir) == str(env.ssd.resolve())
    assert os.stat(p.run_dir).st_mode & 0o777 == 0o700
    assert os.stat(p.cufile_json).st_mode & 0o777 == 0o600
    assert p.env["CUFILE_ENV_PATH_JSON"] == p.cufile_json
    assert p.env["CUFILE_ALLOW_COMPAT_MODE"] == p.env["CUFILE_FORCE_COMPAT_MODE"] == "false"
    assert p.env["ORBITKV_CUFILE_LIBRARY"] == os.path.realpath(env.tools["cufile_library"])
    assert p.env["TMPDIR"].startswith(p.run_dir)
    assert p.artifacts["bench"] == os.path.realpath(env.tools["bench"])  # found next to --manager
    cfg = json.load(open(p.cufile_json))
    assert cfg["profile"]["cufile_stats"] == 3 and cfg["properties"]["allow_compat_mode"] is False
    assert cfg["properties"]["max_direct_io_size_kb"] == 16384  # everything else kept
    assert cfg["logging"]["dir"] == os.path.join(p.run_dir, "logs")


def test_run_directories_are_never_reused(env):
    args = gds_main.parse_args(env.argv)
    preflight.preflight(args, root=env.root, environ=env.environ, detect_virt=lambda: "none", now=1e9)
    # The same second and process: the directory exists, so the run refuses instead of reusing it.
    with pytest.raises(preflight.Refusal, match="cannot create the private run directory"):
        preflight.preflight(args, root=env.root, environ=env.environ, detect_virt=lambda: "none", now=1e9)


# ------------------------------------------------------------------ cufile.json


def test_strip_comments_keeps_strings_and_drops_trailing_commas():
    text = '{"a": "x//y", // c\n "b": "/*z*/", /* d\n e */ "c": [1, 2,],\n "e": {"f": 1,},}'
    assert json.loads(cufile_config.strip_comments(text)) == {"a": "x//y", "b": "/*z*/", "c": [1, 2], "e": {"f": 1}}
    assert json.loads(cufile_config.strip_comments('{"q": "a\\"//b"}')) == {"q": 'a"//b'}
    with pytest.raises(cufile_config.ConfigError):
        cufile_config.strip_comments("{/* open")


def test_nvidia_cufile_json_loads_and_overlays(tmp_path):
    data = cufile_config.load(os.path.join(fakes.FIXTURES, "cufile.json"))
    assert data["properties"]["allow_compat_mode"] is True
    assert data["properties"]["doc_url"] == "https://docs.nvidia.com/gpudirect-storage//cufile.json"
    assert data["fs"]["nfs"] == {}
    out = cufile_config.native_overlay(data, "/run/logs")
    assert out["profile"] == {"nvtx": False, "cufile_stats": 3}
    assert out["properties"]["allow_compat_mode"] is False and "force_compat_mode" not in out["properties"]
    assert data["profile"]["cufile_stats"] == 0  # the input is not modified
    old = dict(data, properties=dict(data["properties"], use_compat_mode=True, force_compat_mode=True))
    o2 = cufile_config.native_overlay(old, "/l")
    assert o2["properties"]["use_compat_mode"] is False and o2["properties"]["force_compat_mode"] is False
    dest = str(tmp_path / "private.json")
    cufile_config.write_private(os.path.join(fakes.FIXTURES, "cufile.json"), dest, "/l")
    assert cufile_config.check_written(dest) is None
    with pytest.raises(FileExistsError):  # never overwrites
        cufile_config.write_private(os.path.join(fakes.FIXTURES, "cufile.json"), dest, "/l")
    fakes.write(dest + "2", '{"profile": {"cufile_stats": 3}, "properties": {"allow_compat_mode": true}}')
    assert "allow_compat_mode is not false" in cufile_config.check_written(dest + "2")


def test_cufile_json_source_order(tmp_path):
    etc = fakes.write(str(tmp_path / "root/etc/cufile.json"), "{}")
    own = fakes.write(str(tmp_path / "mine.json"), "{}")
    root = str(tmp_path / "root")
    assert cufile_config.find_source(None, None, {}, root)[0] == etc
    assert cufile_config.find_source(None, None, {"CUFILE_ENV_PATH_JSON": own}, root)[0] == own
    assert cufile_config.find_source(own, None, {}, root)[0] == own
    assert cufile_config.find_source(str(tmp_path / "no"), None, {}, root)[0] is None


def test_malformed_cufile_json_is_an_error(tmp_path):
    bad = fakes.write(str(tmp_path / "c.json"), '{"properties": {"allow_compat_mode": tru}}')
    with pytest.raises(cufile_config.ConfigError, match="not valid cuFile JSON"):
        cufile_config.load(bad)


# ------------------------------------------------------------------ gds_stats


def stats(name):
    return evidence.parse_gds_stats(fakes.fixture(name))


def test_gds_stats_version_3_two_gpus():
    s = stats("gds_stats_v3.txt")
    assert s.version == 3 and len(s.per_gpu) == 2
    assert s.global_stats["total_read_errors"] == 0 and s.global_stats["total_write_size_mib"] == 8192
    assert s.per_gpu[0]["read"]["n"] == 20480 and s.per_gpu[0]["uuid"] is None
    v = evidence.judge_native(s)
    assert v.ok and v.summary["read_ops"] == 20480 and v.summary["write_ops"] == 8192


def test_gds_stats_version_7_with_uuid_and_batch_counters():
    s = stats("gds_stats_v7.txt")
    assert s.version == 7 and s.per_gpu[0]["uuid"] == "2f9a1c44d0e87b35a61f0c2d9e4b7a18"
    assert s.global_stats["read_ok"] == 48211 and s.global_stats["posix_batch_enqueued_ok"] == 0
    assert s.global_stats["read_bandwidth_gib_s"] == 11.2617
    assert s.per_gpu[0]["read"]["dr"] == 0 and s.per_gpu[0]["read"]["util(%)"] == 198
    assert evidence.judge_native(s).ok


def test_compatibility_mode_statistics_fail():
    v = evidence.judge_native(stats("gds_stats_v7_compat.txt"))
    assert not v.ok and v.reasons == ["57941 POSIX (compatibility) operations"]


@pytest.mark.parametrize("old, new, reason", [
    ("unalign=0 dr=0 r_sparse=0", "unalign=12 dr=0 r_sparse=0", "12 unaligned operations"),
    ("r_sparse=0 r_inline=0", "r_sparse=3 r_inline=0", "3 sparse reads"),
    ("r_inline=0 err=0", "r_inline=5 err=0", "5 inline reads"),
    ("dr=0 err=0 MiB=19460", "dr=0 err=2 MiB=19460", "2 failed operations"),
    ("Read: ok = 48211 err = 0", "Read: ok = 48211 err = 4", "4 errors in GLOBAL STATS"),
    ("PosixBatchEnqueued: ok = 0", "PosixBatchEnqueued: ok = 9", "9 POSIX batch operations"),
    ("BufRegister: n=2 err=0", "BufRegister: n=2 err=1", "1 buffer registration errors"),
    ("n=9730 posix=0", "n=0 posix=0", "no cuFile writes"),
    ("n=48211 posix=0", "n=0 posix=0", "no cuFile reads"),
])
def test_each_rule_fails_on_its_counter(old, new, reason):
    text = fakes.fixture("gds_stats_v7.txt")
    assert old in text
    v = evidence.judge_native(evidence.parse_gds_stats(text.replace(old, new, 1)))
    assert not v.ok and reason in v.reasons


def test_reads_only_requirement_for_a_read_run():
    text = fakes.fixture("gds_stats_v7.txt").replace("n=9730 posix=0", "n=0 posix=0")
    assert evidence.judge_native(evidence.parse_gds_stats(text), require_writes=False).ok


def test_missing_statistics_fail():
    assert evidence.judge_native(None).reasons == ["no cuFile statistics for the process"]
    level1 = fakes.fixture("gds_stats_v7.txt").split("READ-WRITE SIZE HISTOGRAM")[0]
    v = evidence.judge_native(evidence.parse_gds_stats(level1))
    assert not v.ok and "no PER_GPU STATS" in v.reasons[0]


@pytest.mark.parametrize("text, message", [
    ("", "no 'cuFile STATS VERSION' line"),
    ("Error: stats not enabled for pid 12\n", "no 'cuFile STATS VERSION' line"),
    ("cuFile STATS VERSION : 7\nREAD-WRITE SIZE HISTOGRAM :\n", "no GLOBAL STATS"),
    ("cuFile STATS VERSION : 9\nGLOBAL STATS:\nRead: ok = x err = 0\n", "not a number"),
    ("cuFile STATS VERSION : 7\nGLOBAL STATS:\nsomething odd\n", "unknown GLOBAL STATS line"),
])
def test_unknown_output_is_an_error_never_zero(text, message):
    with pytest.raises(evidence.FormatError, match=message):
        evidence.parse_gds_stats(text)


def test_per_gpu_line_without_a_required_counter_is_unknown():
    text = fakes.fixture("gds_stats_v7.txt").replace(" r_inline=0", "")
    with pytest.raises(evidence.FormatError, match="read statistics lack r_inline"):
        evidence.parse_gds_stats(text)
    text = fakes.fixture("gds_stats_v7.txt").replace("GPU 0(UUID", "GPU zero(UUID")
    with pytest.raises(evidence.FormatError, match="unknown PER_GPU STATS line"):
        evidence.parse_gds_stats(text)


def test_appended_captures_use_the_last_complete_one():
    v3, v7 = fakes.fixture("gds_stats_v3.txt"), fakes.fixture("gds_stats_v7.txt")
    assert evidence.parse_gds_stats(v3 + "\n" + v7).version == 7
    truncated = v7.split("PER_GPU STATS:")[0] + "PER_GPU STATS:\nGPU 0(UUID: 2f) Read: bw=1"
    assert evidence.parse_gds_stats(v3 + truncated).version == 3


# ------------------------------------------------------------------ gdsio and gdscheck


def test_gdsio_summary():
    line = ("IoType: READ XferType: GPUD Threads: 8 DataSetSize: 818796544/4096000(KiB) IOSize: 1024(KiB) "
            "Throughput: 6.524658 GiB/sec, Avg_Latency: 1197.370995 usecs ops: 799606 total_time 119.679102 secs")
    g = evidence.parse_gdsio("warming up\n" + line + "\n")
    assert g["io_type"] == "READ" and g["xfer_type"] == "GPUD" and g["ops"] == 799606
    assert g["throughput_gib_s"] == 6.524658 and g["total_time_s"] == 119.679102
    with pytest.raises(evidence.FormatError):
        evidence.parse_gdsio("Error: cuFileHandleRegister failed: 5030\n")


def test_gdscheck_native_compat_and_no_route():
    native = evidence.parse_gdscheck(fakes.fixture("gdscheck_native.txt"))
    assert native.drivers["NVMe"] == "Supported" and native.platform_ok is True
    assert evidence.compat_problem(native) is None and evidence.nvme_native_problem(native) is None
    assert native.properties["profile.cufile_stats"] == "3" and native.versions["nvidia_fs"] == "2.27"
    old = evidence.parse_gdscheck(fakes.fixture("gdscheck_compat_old.txt"))
    assert evidence.compat_problem(old) == "gdscheck -p reports compatibility mode allowed"
    none = evidence.parse_gdscheck(fakes.fixture("gdscheck_no_nvfs.txt"))
    assert evidence.nvme_native_problem(none) == "gdscheck -p: NVMe : Unsupported (no native route)"
    assert none.platform_ok is False
    routes = fakes.fixture("gdscheck_native.txt").replace("NVMe               : Supported",
                                                          "NVMe               : nvfs, compat")
    assert evidence.nvme_native_problem(evidence.parse_gdscheck(routes)) is None
    only_compat = routes.replace("nvfs, compat", "compat")
    assert "no native route" in evidence.nvme_native_problem(evidence.parse_gdscheck(only_compat))
    p2p = fakes.fixture("gdscheck_no_nvfs.txt").replace("NVMe P2PDMA        : Unsupported",
                                                        "NVMe P2PDMA        : Supported")
    p2p = p2p.replace("Platform verification error: nvidia_fs driver not loaded", "Platform verification succeeded")
    assert evidence.nvme_native_problem(evidence.parse_gdscheck(p2p)) is None
    forced = fakes.fixture("gdscheck_native.txt").replace("force_compat_mode : false", "force_compat_mode : true")
    assert "force_compat_mode true" in evidence.compat_problem(evidence.parse_gdscheck(forced))
    silent = fakes.fixture("gdscheck_native.txt").replace("properties.use_compat_mode : false\n", "")
    assert "reports neither" in evidence.compat_problem(evidence.parse_gdscheck(silent))
    with pytest.raises(evidence.FormatError):
        evidence.parse_gdscheck("gdscheck: command not found\n")


# ------------------------------------------------------------------ /proc and /metrics


def test_proc_readers_on_a_fake_proc(tmp_path):
    proc = str(tmp_path)
    fakes.write(f"{proc}/42/stat", "42 (orbitkv cache) S 1 42 42 0 -1 4194560 500 0 0 0 250 150 0 0 20 0 9 0\n")
    fakes.write(f"{proc}/42/io", "rchar: 100\nwchar: 200\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\n"
                "write_bytes: 8192\ncancelled_write_bytes: 0\n")
    fakes.write(f"{proc}/42/cmdline", "/opt/m\0--metrics-port\0019464\0--socket\0/s\0")
    assert procs.read_cpu_seconds(42, proc) == pytest.approx(400 / procs.CLK_TCK)
    assert procs.read_proc_io(42, proc)["write_bytes"] == 8192
    argv = procs.read_cmdline(42, proc)
    assert procs.flag_value(argv, "--metrics-port") == "019464" or procs.flag_value(argv, "--socket") == "/s"
    assert procs.read_cpu_seconds(43, proc) is None and procs.read_proc_io(43, proc) is None
    fakes.write(f"{proc}/50/stat", "50 (x) S 42 50 50 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0\n")
    assert procs.children_of(42, proc) == [50]


def test_metrics_sum_labels_and_skip_buckets():
    m = procs.parse_metrics('# HELP a b\norbitkv_ssd_cufile_read_bytes_total{device="cuda:0"} 10\n'
                            'orbitkv_ssd_cufile_read_bytes_total{device="cuda:1"} 5\n'
                            'orbitkv_x_seconds_bucket{le="1"} 3\norbitkv_x_seconds_count 3\nbad line\n')
    assert m == {"orbitkv_ssd_cufile_read_bytes_total": 15.0, "orbitkv_x_seconds_count": 3.0}


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b"orbitkv_ssd_backend_fallbacks_total 0\norbitkv_ssd_cufile_write_bytes_total 4096\n"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def test_watch_samples_a_live_process_and_keeps_its_last_statistics(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FIXTURES", fakes.FIXTURES)
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    t = fakes.tools(str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.2)", "--metrics-port",
                              str(srv.server_address[1])])
    log = str(tmp_path / "stats.txt")
    w = procs.Watch(child.pid, gds_stats=t["gds_stats"], stats_log=log, interval=0.1)
    th = threading.Thread(target=w.run_until_exit)
    th.start()
    child.wait()
    th.join()
    srv.shutdown()
    r = w.record()
    assert w.captures >= 2 and r["gds_stats"]["version"] == 7 and r["gds_stats"]["error"] is None
    assert r["metrics"]["orbitkv_ssd_cufile_write_bytes_total"] == 4096
    assert r["cpu_seconds"] is not None and r["proc_io"]["rchar"] > 0
    assert open(log).read().count("gds_stats -p %d -l 3 (exit 0)" % child.pid) == w.captures
    assert stages.native_verdict(w).ok


def test_watch_of_a_process_without_statistics_fails_the_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FIXTURES", fakes.FIXTURES)
    monkeypatch.setenv("FAKE_GDS_STATS_DISABLED", "1")
    t = fakes.tools(str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    w = procs.Watch(child.pid, gds_stats=t["gds_stats"], interval=0.1)
    threading.Thread(target=lambda: child.wait(), daemon=True).start()
    w.run_until_exit()
    v = stages.native_verdict(w)
    assert not v.ok and "cufile_stats not enabled" in v.reasons[0]


# ------------------------------------------------------------------ stage rules


def _watch(metrics, stats_name="gds_stats_v7.txt"):
    w = procs.Watch(pid=7)
    w.metrics = metrics
    if stats_name:
        w.stats_text, w.captures = fakes.fixture(stats_name), 1
    return w


GOOD = {"points": [{"routes": [{"status": "ok", "verification": {"ok": True}}]}]}
NATIVE = {"orbitkv_ssd_backend_fallbacks_total": 0, "orbitkv_ssd_cufile_read_bytes_total": 1,
          "orbitkv_ssd_cufile_write_bytes_total": 1}


def test_bench_run_rules():
    assert stages.judge_bench_run("cufile", 0, GOOD, [_watch(NATIVE)]) == []
    assert stages.judge_bench_run("io_uring", 0, GOOD, [_watch({}, None)]) == []
    fell = stages.judge_bench_run("auto", 0, GOOD, [_watch(dict(NATIVE, orbitkv_ssd_backend_fallbacks_total=1))])
    assert any("backend fallback" in r for r in fell)
    assert any("orbitkv_ssd_cufile_read_bytes_total is 0" in r for r in
               stages.judge_bench_run("auto", 0, GOOD, [_watch(dict(NATIVE, orbitkv_ssd_cufile_read_bytes_total=0))]))
    assert any("no /metrics" in r for r in stages.judge_bench_run("auto", 0, GOOD, [_watch(None)]))
    assert any("POSIX" in r for r in stages.judge_bench_run("cufile", 0, GOOD, [_watch(NATIVE, "gds_stats_v7_compat.txt")]))
    assert any("no cuFile statistics" in r for r in stages.judge_bench_run("cufile", 0, GOOD, [_watch(NATIVE, None)]))
    assert "wrong bytes restored (exit 1)" in stages.judge_bench_run("dram", 1, GOOD, [_watch({}, None)])
    assert "no JSON report" in stages.judge_bench_run("dram", 3, None, [_watch({}, None)])
    assert "no Manager process was seen" in stages.judge_bench_run("dram", 0, GOOD, [])
    bad = {"points": [{"routes": [{"status": "ok", "verification": {"ok": False}}]}]}
    assert "verification failed" in stages.judge_bench_run("dram", 0, bad, [_watch({}, None)])


def test_gtest_listing_and_gate_groups():
    text = ("Running main() from gmock_main.cc\nGpuTierGate.\n  SplitLayoutWritesAndRestoresThroughCufile\n"
            "  LeasedExtentIsNotOverwrittenByWrappingWrites\nTransferShape.\n  FourAdjacentPagesAreOne256KiBRead\n"
            "Param/Gate.  # TypeParam = int\n  Works/0  # GetParam() = 1\n")
    names = stages.list_gtests(text)
    assert names == ["GpuTierGate.SplitLayoutWritesAndRestoresThroughCufile",
                     "GpuTierGate.LeasedExtentIsNotOverwrittenByWrappingWrites",
                     "TransferShape.FourAdjacentPagesAreOne256KiBRead", "Param/Gate.Works/0"]
    assert [stages.gate_group(n) for n in names[:3]] == ["exact GPU-byte recovery", "pinning", "exact GPU-byte recovery"]
    assert stages.gate_group("GpuTierGate.CheckpointLargerThanStagingIsSplitAcrossIt") == "large checkpoints"
    assert stages.gate_group("GpuTierGate.FragmentedPublicationSealsInDramAndRestoresThroughCufile") == "fragmented saves"


def test_engine_check_templates():
    argv = stages.expand("{python} -m pytest {repo}/python/tests/x.py --storage-codec {codec}",
                         {"python": "/v/bin/python", "repo": "/r", "codec": "fp8"})
    assert argv == ["/v/bin/python", "-m", "pytest", "/r/python/tests/x.py", "--storage-codec", "fp8"]
    assert stages.missing_repo_paths(argv, "/r") == ["/r/python/tests/x.py"]


# ------------------------------------------------------------------ whole runs


def full_run(env, extra=(), environ=None, codecs=("none", "ans"), sequence=None):
    out = []
    rc = gds_main.main(env.argv + ["--storage-codecs", *codecs, "--workloads", "serial-prefix"] + list(extra),
                       root=env.root, environ=dict(env.environ, **(environ or {})), detect_virt=lambda: "none",
                       sequence=sequence)
    (d,) = run_dirs(env.ssd)
    with open(os.path.join(env.ssd, d, "qualification.json")) as f:
        out.append(json.load(f))
    return rc, out[0], os.path.join(env.ssd, d)


def by_name(q):
    return {s["name"]: s for s in q["stages"]}


def test_whole_run_with_missing_pieces_is_not_qualified(env, capsys):
    t0 = time.monotonic()
    rc, q, d = full_run(env, environ={"FAKE_SKIP_GATE": "GpuTierGate.CheckpointLargerThanStagingIsSplitAcrossIt"})
    assert rc == gds_main.EXIT_FAILED and q["finished"] and not q["qualified"]
    s = by_name(q)
    for name in ("topology", "gdscheck -p", "gdsio native write", "gdsio native read",
                 "gate GpuTierGate.SplitLayoutWritesAndRestoresThroughCufile", "failed cuFile reads", "Manager death"):
        assert s[name]["status"] == "passed", (name, s[name])
    assert s["gdsio native read"]["details"]["native"]["ok"] is True
    assert s["gdsio native read"]["details"]["gdsio"]["xfer_type"] == "GPUD"
    skipped = s["gate GpuTierGate.CheckpointLargerThanStagingIsSplitAcrossIt"]
    assert skipped["status"] == "failed" and "skipped: cuFile unavailable: cuFileDriverOpen: 5001" in skipped["reason"]
    # The test-hooks Manager of this build has only the read hook: the write faults are not available.
    assert s["failed cuFile writes"]["status"] == "not available"
    assert "ORBITKV_TEST_FAIL_CUFILE_WRITES" in s["failed cuFile writes"]["reason"]
    assert s["stalled cuFile writes"]["status"] == "not available"
    # No engine environments given, the default checks' files are absent.
    assert s["vLLM correctness (none, cufile)"]["reason"] == "no --vllm-python given"
    assert s["SGLang correctness (ans, cufile)"]["status"] == "not available"
    # orbitkv-bench without ssd-cufile and --storage-codec.
    assert s["bench serial-prefix none cufile"]["reason"] == "orbitkv-bench has no ssd-cufile route"
    assert s["bench serial-prefix ans dram"]["reason"] == "orbitkv-bench has no --storage-codec"
    for route in ("dram", "io_uring", "auto"):
        assert s[f"bench serial-prefix none {route}"]["status"] == "passed", s[f"bench serial-prefix none {route}"]
    runs = {r["route"]: r for r in q["runs"]}
    auto = runs["auto"]
    assert auto["passed"] and auto["ttft_ms"]["p50"] == 3.2 and auto["restore_gbps"] == 9.5
    (mgr,) = auto["managers"]
    assert mgr["gds_stats"]["version"] == 7 and mgr["metrics"]["orbitkv_ssd_cufile_read_bytes_total"] > 0
    assert mgr["cpu_seconds"] is not None and mgr["proc_io"]["rchar"] > 0
    assert auto["native"][0]["ok"] and "gds_stats" not in runs["io_uring"]["managers"][0]
    assert all(x["exit"] is not None or x["status"] == "not available" for x in q["stages"]
               if x["name"].startswith(("gate", "gdsio", "bench")))
    assert q["counts"]["not available"] > 0 and q["config"]["environment"]["CUFILE_ALLOW_COMPAT_MODE"] == "false"
    assert os.path.exists(os.path.join(d, "logs", "gdsio_native_read.gds_stats.txt"))
    assert "NOT QUALIFIED" in capsys.readouterr().out
    assert time.monotonic() - t0 < 60


def test_whole_run_qualifies_when_every_stage_passes(env):
    check = env.tools["check"]
    tmpl = f"{{python}} {check} --model {{model}} --codec {{codec}} --backend {{backend}}"
    rc, q, _ = full_run(env, ["--vllm-python", sys.executable, "--sglang-python", sys.executable,
                              "--model-check", tmpl, "--vllm-check", tmpl, "--sglang-check", tmpl],
                        environ={"FAKE_HOOKS": "all",
                                 "FAKE_BENCH_HELP_EXTRA": ", ssd-cufile\n  --storage-codec TEXT"},
                        codecs=("ans",))
    failing = [(s["name"], s["status"], s["reason"]) for s in q["stages"] if s["status"] != "passed"]
    assert failing == [] and rc == gds_main.EXIT_QUALIFIED and q["qualified"]
    s = by_name(q)
    r = s["vLLM correctness (ans, cufile)"]["details"]["result"]
    assert r["codec"] == "ans" and r["ttft_ms"] == 41.5
    assert len([x for x in q["runs"] if x["codec"] == "ans"]) == 4
    assert {x["seed"] for x in q["runs"]} == {1}


def test_strict_failures_stay_failures_while_evidence_is_collected(env):
    check = env.tools["check"]
    tmpl = f"{{python}} {check}"
    rc, q, _ = full_run(env, ["--vllm-python", sys.executable, "--vllm-check", tmpl, "--routes", "dram", "auto"],
                        environ={"FAKE_CHECK_EXIT": "1", "FAKE_FALLBACK": "1", "FAKE_BENCH_MISMATCH": "1"},
                        codecs=("none",), sequence=(stages.engine_checks, stages.benchmarks))
    s = by_name(q)
    assert rc == gds_main.EXIT_FAILED
    assert s["vLLM correctness (none, cufile)"]["status"] == "failed"
    assert s["bench serial-prefix none dram"]["reason"].startswith("wrong bytes restored (exit 1)")
    assert "backend fallback" in s["bench serial-prefix none auto"]["reason"]
    # The benchmark evidence is still there.
    assert {r["route"] for r in q["runs"]} == {"dram", "auto"}


def test_manager_death_needs_an_engine_that_ran_under_the_manager(env):
    _, q, _ = full_run(env, environ={"FAKE_ENGINE_CANNOT_CONNECT": "1"}, codecs=("none",),
                       sequence=(stages.manager_death,))
    death = by_name(q)["Manager death"]
    assert death["status"] == "failed" and "did not run under the Manager" in death["reason"]


@pytest.mark.parametrize("environ, reason", [
    ({"FAKE_GDSIO_XFER": "CPU_GPU"}, "XferType CPU_GPU, not GPUD"),
    ({"FAKE_GDS_STATS_FIXTURE": "gds_stats_v7_compat.txt"}, "57941 POSIX (compatibility) operations"),
    ({"FAKE_GDS_STATS_DISABLED": "1"}, "no cuFile statistics: gds_stats exit 1: cufile_stats not enabled"),
])
def test_gdsio_stage_needs_gpud_and_native_statistics(env, environ, reason):
    _, q, _ = full_run(env, environ=environ, codecs=("none",), sequence=(stages.gdsio,))
    for name in ("gdsio native write", "gdsio native read"):
        assert by_name(q)[name]["status"] == "failed" and reason in by_name(q)[name]["reason"]


def test_check_exit_77_is_not_available(env):
    tmpl = f"{{python}} {env.tools['check']}"
    _, q, _ = full_run(env, ["--vllm-python", sys.executable, "--vllm-check", tmpl, "--routes", "dram"],
                       environ={"FAKE_CHECK_EXIT": "77"}, codecs=("none",), sequence=(stages.engine_checks,))
    assert by_name(q)["vLLM correctness (none, cufile)"]["status"] == "not available"


def test_refusal_exit_status_and_one_line(env, capsys):
    firecracker(env.root)
    rc = gds_main.main(env.argv, root=env.root, environ=env.environ, detect_virt=lambda: "kvm")
    err = capsys.readouterr().err
    assert rc == gds_main.EXIT_REFUSED and err.count("\n") == 1 and err.startswith("benches.gds: refused: ")
    assert run_dirs(env.ssd) == []


def test_bad_flags_exit_2(env):
    assert gds_main.main(env.argv + ["--storage-codecs", "zstd"]) == gds_main.EXIT_USAGE
