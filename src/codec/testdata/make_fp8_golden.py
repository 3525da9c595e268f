#!/usr/bin/env python3
"""Writes fp8_e4m3fn_torch.bin, the golden vectors of fp8_test.cc, with PyTorch.

Run once where torch is installed (the H200 host has 2.11.0):
    python3 make_fp8_golden.py OUT_DIR
Layout (little-endian):
  "OKVFP8G1", torch version as 16 NUL-padded bytes,
  u8[65536]  bf16 bit pattern v -> torch bf16(v).to(float8_e4m3fn) byte
  u8[65536]  fp16 bit pattern v -> torch fp16(v).to(float8_e4m3fn) byte
  u32 groups G, u32 group size N
  u16[G*N]   bf16 inputs x
  f32[G]     scale = clamp(amax_finite(|x|) / 448, min=FLT_MIN)
  u8[G*N]    (x.float() / scale).to(float8_e4m3fn)
  u16[G*N]   (q.float() * scale).to(bfloat16)
"""
import os
import struct
import sys

import torch


def main(out_dir):
    all16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    bf16 = all16.view(torch.bfloat16)
    fp16 = all16.view(torch.float16)
    table_bf16 = bf16.to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes()
    table_fp16 = fp16.to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes()

    g, n = 64, 128
    gen = torch.Generator().manual_seed(20261201)
    x = torch.randn(g, n, generator=gen) * torch.rand(g, 1, generator=gen).pow(4) * 50
    x[1] = 0.0
    x[2, ::2] = -0.0
    x[3] = torch.randn(n, generator=gen) * 1e-39  # bf16 subnormals
    x[4, 5] = float("inf")
    x[4, 6] = float("-inf")
    x[5, 7] = float("nan")
    x[6] = torch.randn(n, generator=gen) * 3e38
    xb = x.to(torch.bfloat16)
    xf = xb.float()
    finite = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf))
    amax = finite.amax(dim=1)
    scale = torch.clamp(amax / 448.0, min=torch.finfo(torch.float32).tiny)
    q = (xf / scale[:, None]).to(torch.float8_e4m3fn)
    back = (q.float() * scale[:, None]).to(torch.bfloat16)

    path = os.path.join(out_dir, "fp8_e4m3fn_torch.bin")
    with open(path, "wb") as f:
        f.write(b"OKVFP8G1")
        f.write(torch.__version__.encode()[:16].ljust(16, b"\0"))
        f.write(table_bf16)
        f.write(table_fp16)
        f.write(struct.pack("<II", g, n))
        f.write(xb.view(torch.int16).numpy().tobytes())
        f.write(scale.numpy().astype("<f4").tobytes())
        f.write(q.view(torch.uint8).numpy().tobytes())
        f.write(back.view(torch.int16).numpy().tobytes())
    print(path, os.path.getsize(path), "bytes, torch", torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
