#!/usr/bin/env python3
"""gpu_busy.py: stands in for an inference engine's compute beside OrbitKV.

Runs bf16 matrix products on one CUDA device, back to back on one stream, in
its own process (so its own CUDA context, as an engine's), until --seconds
have passed or the file --stop names exists. Each product of --size takes
about a millisecond on an H200, about one layer of a large model's prefill.
At the end it prints how many it ran and the TFLOP/s they reached, so a
benchmark run beside it can say how busy the GPU was.

Run by scripts/h200_perf.sh on the GPU host with its python3 (torch is
installed there); it is not part of the test suite.

  python3 scripts/gpu_busy.py --device cuda:0 --seconds 60 --stop /tmp/stop
"""
import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--size", type=int, default=8192, help="square matrix side")
    ap.add_argument("--stop", default="", help="stop as soon as this file exists")
    ap.add_argument("--ready", default="", help="create this file once the loop runs")
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"gpu_busy: torch is not importable ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_busy: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    x = torch.randn(a.size, a.size, device=dev, dtype=torch.bfloat16)
    y = torch.randn(a.size, a.size, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    torch.matmul(x, y, out=out)
    torch.cuda.synchronize(dev)
    if a.ready:
        open(a.ready, "w").close()
    start = time.monotonic()
    done = 0
    # A few products in flight at a time, as an engine keeps its stream fed;
    # synchronising every 8 keeps the stop check responsive.
    while time.monotonic() - start < a.seconds and not (a.stop and os.path.exists(a.stop)):
        for _ in range(8):
            torch.matmul(x, y, out=out)
        torch.cuda.synchronize(dev)
        done += 8
    elapsed = time.monotonic() - start
    tflops = 2.0 * a.size**3 * done / elapsed / 1e12 if elapsed > 0 else 0.0
    print(f"gpu_busy: {done} bf16 products of {a.size}^3 in {elapsed:.2f} s: {tflops:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
