#!/usr/bin/python3
"""Plots an orbitkv-bench JSON report: restore (and publish) throughput against
block size, one line per route, with the ceilings measured in the same run as
dashed lines. orbitkv-bench --png runs it with /usr/bin/python3; it needs
python3-matplotlib (scripts/setup.sh installs it).

usage: bench_plot.py REPORT.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROUTE_STYLE = {"dram": "tab:blue", "ssd-uring": "tab:green", "ssd-auto": "tab:purple",
               "naive": "tab:red"}
CEILINGS = [("memcpy_multi", "memcpy x{threads}", "tab:blue"),
            ("memcpy_single", "memcpy x1", "tab:cyan"),
            ("fio_read", "fio read", "tab:green"),
            ("fio_write", "fio write", "tab:olive"),
            ("cuda_h2d", "cudaMemcpy H2D", "tab:purple")]


def series(points, kind):
    """{route: ([block MiB], [GB/s])} for routes that moved bytes."""
    out = {}
    for p in points:
        for r in p["routes"]:
            if r.get("status") != "ok" or not r[kind]["bytes"]:
                continue
            xs, ys = out.setdefault(r["route"], ([], []))
            xs.append(p["block_bytes"] / 2**20)
            ys.append(r[kind]["gbps"])
    return out


def ceiling_series(points, key):
    xs, ys = [], []
    for p in points:
        c = p["ceilings"][key]
        if c.get("status") == "ok":
            xs.append(p["block_bytes"] / 2**20)
            ys.append(c["gbps"])
    return xs, ys


def panel(ax, points, kind, ceiling_keys, title):
    single = len(points) == 1
    for key, label, color in CEILINGS:
        if key not in ceiling_keys:
            continue
        if key == "memcpy_single" and points[0]["ceilings"]["memcpy_threads"] == 1:
            continue  # the same measurement as memcpy_multi
        xs, ys = ceiling_series(points, key)
        if not xs:
            continue
        label = label.format(threads=points[0]["ceilings"]["memcpy_threads"])
        if single:
            ax.axhline(ys[0], color=color, linestyle="--", linewidth=1, label=f"{label} (ceiling)")
        else:
            ax.plot(xs, ys, color=color, linestyle="--", linewidth=1, label=f"{label} (ceiling)")
    for route, (xs, ys) in series(points, kind).items():
        ax.plot(xs, ys, marker="o", color=ROUTE_STYLE.get(route), label=route)
    ax.set_xscale("log", base=2)
    if single:
        x = points[0]["block_bytes"] / 2**20
        ax.set_xlim(x / 2, x * 2)
    ax.set_xlabel("block size (MiB)")
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        report = json.load(f)
    points = sorted(report["points"], key=lambda p: p["block_bytes"])
    panels = [("restore", {"memcpy_multi", "memcpy_single", "fio_read", "cuda_h2d"}),
              ("publish", {"memcpy_multi", "fio_write"})]
    panels = [(kind, keys) for kind, keys in panels if series(points, kind)] or panels[:1]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8, 6 * len(panels)), 4.5), squeeze=False)
    for ax, (kind, keys) in zip(axes[0], panels):
        panel(ax, points, kind, keys, kind)
    tokens = ", ".join(str(p["block_tokens"]) for p in points)
    fig.suptitle(f"orbitkv-bench {report['workload']}: {report['model']['name']}, "
                 f"{tokens}-token blocks, device {report['device']}, seed {report['seed']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
