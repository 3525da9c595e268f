#!/usr/bin/env python3
"""A short multi-turn chat served through orbitkv.transformers.PrefixCache.

Every turn's prompt is the whole conversation so far; the cache restores what
earlier turns computed (their KV, published by the previous prefill and by the
answer) and computes only the new tokens. Prints restored vs computed tokens
and the time of each step per turn.

  python examples/transformers_chat.py                      # random-weight Qwen3 on cuda:0 or CPU
  python examples/transformers_chat.py --model /path/to/hf-model   # a local model + tokenizer
  python examples/transformers_chat.py --socket /run/orbitkv.sock  # an already running Manager

Without --socket it starts the wheel's orbitkv-cache-manager in a temporary
directory and stops it at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import tempfile
import time

import torch

import orbitkv
import orbitkv.transformers as okt

TURNS = [
    "Summarise the design of a KV-cache manager in two sentences.",
    "Which tier serves a restore after the DRAM pool evicted the block?",
    "And what happens when that SSD object is corrupted?",
]


class ToyTokenizer:
    """Bytes as token ids (for the random-weight model: no tokenizer files)."""

    def encode(self, text: str):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i % 256 for i in ids).decode(errors="replace")


def load(args):
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
        return model, tok
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=256, hidden_size=512, intermediate_size=1536,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=64, tie_word_embeddings=True)
    cfg._name_or_path = "orbitkv-example-qwen3-random"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype).eval(), ToyTokenizer()


def start_manager(workdir: str):
    sock = os.path.join(workdir, "m.sock")
    proc = subprocess.Popen(
        [orbitkv.manager_binary(), "--socket", sock, "--metrics-port", "0", "--pool-size", "1gib",
         "--ssd-cache-path", os.path.join(workdir, "cache.bin"), "--ssd-cache-capacity", "2gib"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(400):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            return proc, sock
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"orbitkv-cache-manager exited with {proc.returncode}")
            time.sleep(0.05)
    raise RuntimeError("orbitkv-cache-manager did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="local transformers model directory (default: random Qwen3)")
    ap.add_argument("--device", help="cuda:N or cpu (default cuda:0 when present)")
    ap.add_argument("--socket", help="a running Manager's socket (default: start one)")
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--system-tokens", type=int, default=1024, help="length of the system prompt")
    args = ap.parse_args()

    model, tok = load(args)
    proc = None
    workdir = tempfile.mkdtemp(prefix="orbitkv-chat-", dir="/var/tmp")
    sock = args.socket
    if not sock:
        proc, sock = start_manager(workdir)
    try:
        with orbitkv.Client(sock) as client, okt.PrefixCache(model, client, num_pages=256) as cache:
            system = ("You are a careful assistant. " * 200)
            history = tok.encode(system)[: args.system_tokens]
            print(f"namespace {cache.ns}\nblock {cache.block_bytes} bytes, system prompt "
                  f"{len(history)} tokens\n")
            print(f"{'turn':>4} {'prompt':>7} {'restored':>9} {'computed':>9} {'query ms':>9} "
                  f"{'restore ms':>11} {'compute ms':>11} {'TTFT ms':>8}  sources")
            for i, question in enumerate(TURNS):
                history += tok.encode(f"\nUser: {question}\nAssistant:")
                t0 = time.perf_counter()
                r = cache.prefill(history)
                ttft = time.perf_counter() - t0 - r.timings.get("publish", 0)
                answer = okt.greedy(model, r.cache, r.logits, args.answer_tokens)
                t = r.timings
                print(f"{i + 1:>4} {len(history):>7} {r.restored_tokens:>9} {r.computed_tokens:>9} "
                      f"{t.get('query', 0) * 1e3:>9.1f} {t.get('restore', 0) * 1e3:>11.1f} "
                      f"{t['compute'] * 1e3:>11.1f} {ttft * 1e3:>8.1f}  {r.sources or '-'}"
                      + (f"  errors {r.errors}" if r.errors else ""))
                # The answer's KV too (all but the last token, which was never fed back).
                held = r.cache.get_seq_length()
                cache.publish(r.cache, (history + answer)[:held], first_block=len(history) // 16)
                history += answer
            print("\n(random weights: the answers are noise; the KV reuse is real)" if not args.model
                  else "")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
