#!/usr/bin/python3
"""Plots an h200_perf.sh output directory: per run (one orbitkv-bench JSON
each) and route, restore and publish GB/s as bars next to the ceiling the
bench measured in the same run (dashed), labelled with the fraction.

  /usr/bin/python3 scripts/h200_perf_plot.py OUT_DIR PNG

Reads every OUT_DIR/*.json that is an orbitkv-bench report with one point
(block-size-sweep at one size, publish-only, restore-only); skips the rest
(scale, query-scale) and says so. Needs python3-matplotlib (scripts/setup.sh).
"""
import json
import sys
from pathlib import Path


def bars(report_dir: Path):
    """(label, route, kind, gbps, ceiling_gbps, ceiling_name) per measured route."""
    out = []
    for f in sorted(report_dir.glob("*.json")):
        try:
            j = json.loads(f.read_text())
            points = j["points"]
        except (ValueError, KeyError):
            print(f"h200_perf_plot: {f.name}: not a bench report with points, skipped")
            continue
        if len(points) != 1:
            print(f"h200_perf_plot: {f.name}: {len(points)} points, skipped")
            continue
        p = points[0]
        for r in p["routes"]:
            for kind in ("restore", "publish"):
                t = r.get(kind) or {}
                if not t.get("gbps"):
                    continue
                name = t.get("ceiling", "")
                key = {"cuda H2D": "cuda_h2d", "cuda D2H": "cuda_d2h", "probe read": "fio_read",
                       "fio read": "fio_read"}.get(name)
                ceiling = p["ceilings"].get(key, {}).get("gbps") if key else None
                out.append((f.stem, r["route"], kind, t["gbps"], ceiling, name))
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[4].strip(), file=sys.stderr)
        return 2
    rows = bars(Path(sys.argv[1]))
    if not rows:
        print("h200_perf_plot: no bench report to plot", file=sys.stderr)
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows)), 4.8))
    colors = {"restore": "#3b75af", "publish": "#e1812c"}
    for i, (run, route, kind, gbps, ceiling, cname) in enumerate(rows):
        ax.bar(i, gbps, color=colors[kind], width=0.7)
        if ceiling:
            ax.hlines(ceiling, i - 0.4, i + 0.4, colors="k", linestyles="dashed", linewidth=1)
            ax.text(i, gbps, f"{gbps / ceiling:.0%}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{run}\n{route}" for run, route, *_ in rows], rotation=60, ha="right",
                       fontsize=7)
    ax.set_ylabel("GB/s")
    ax.set_title("orbitkv-bench: restore (blue) and publish (orange) GB/s\n"
                 "dashed: the ceiling measured in the same run (cudaMemcpy H2D/D2H, disk probe)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"h200_perf_plot: {len(rows)} bars -> {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
