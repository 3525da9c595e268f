#!/usr/bin/env python3
"""The vLLM connector's worker side on CUDA pages, without vLLM (run on a GPU host).

Replays the connector metadata that vLLM's real scheduler produced in the CPU
test (tests/vllm/fixtures/worker_replay.json, recorded by
test_prefix_hit_across_requests_restores_the_saved_blocks) through
orbitkv.vllm.worker.WorkerCore, with torch CUDA tensors in each of vLLM's KV
layouts (per-layer (2, num_blocks, ...), block-first, HND strides) allocated
by PyTorch's caching allocator (regions from real pointers, strides and IPC
handles): the forward's rows are written on the GPU, saved through the
Manager, restored into the planned blocks and compared byte for byte.

The Mamba replay (tests/vllm/fixtures/worker_replay_mamba.json, recorded by
test_mamba_prefix_hit_recorded_for_the_worker_gate: a full attention + Mamba
model in vLLM's align mode) does the same for a hybrid KV cache on CUDA: per
layer pair one buffer seen as block-first KV by the attention layer and as
vLLM's raw state pages by the Mamba layer (a bf16 conv and an fp32 SSM state),
registered with the model description; the states vLLM offered are saved as
checkpoints, and the prefix hit restores attention blocks and the state after
exactly the hit, compared byte for byte (and the recurrence the stand-in
forward runs from the restored state checks every later state).

With --model, the forward is a real transformers model's (the real-model
gate's Qwen3: "tiny", fp32 on the CPU, or "qwen3-400m", bf16 on CUDA) over
the recorded prompts: each recorded write gathers the request's KV from its
vLLM blocks, runs the model over the write's tokens and scatters the new K/V
rows into its blocks. The steps up to the first load run on one worker
instance, which saves the prefill (WorkerCore.save, what the connector's
wait_for_save calls); the rest on a second instance with fresh tensors, which
restores it (start_load, wait_for_layer_load, get_finished: the connector's
start_load_kv, wait_for_layer_load, get_finished). The restored rows must
equal, byte for byte, the KV of computing the prefix with the same chunking
(no Manager, no paging), and so must the logits of every later write and the
greedy tokens decoded from the restored KV (16 tiny, 64 qwen3-400m, as in
real_model_gate.py); the logits also stay within the real-model gate's
tolerance of a one-pass prefill of the whole prompt.

  PYTHONPATH=<build>/python python3 tests/gpu/vllm_worker_gate.py \
      --manager <build>/src/server/orbitkv-cache-manager [--device cuda:0] [--ssd-dir /var/tmp] \
      [--model tiny|qwen3-400m]

Prints one PASS line per layout (and one for the Mamba replay) and exits 0; a wrong byte, logit or token or
a load error prints FAIL and exits 1; no CUDA device exits 77 (skip).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vllm"))
sys.path.insert(0, str(HERE))

import kvreplay  # noqa: E402


def wait_listening(path: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"FAIL: the Manager exited with {proc.returncode}:\n{log.read_text()}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    sys.exit(f"FAIL: the Manager did not listen:\n{log.read_text()}")


# ---- --model: a real model's forward over vLLM-layout tensors ----------------------


def run_model(model, cache, token_ids):
    """The model over `token_ids` after what `cache` holds: the last position's
    logits [1, vocab] (float32)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].float()


class PagedModel:
    """A model as the replay's forward over vLLM's paged KV tensors. A recorded
    write [start, end) of a request gathers the request's K/V rows [0, start)
    from its blocks into a DynamicCache, runs the model over tokens[start:end]
    and scatters the new rows into its blocks: what a restore brought is what
    the model attends to. Keeps every write's logits per request."""

    def __init__(self, model, spec: dict, kv_caches: dict) -> None:
        self.model, self.spec, self.kv = model, spec, kv_caches
        self.logits = {}  # req_id -> [(end, logits)]

    def gather(self, block_ids, n: int):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if n == 0:
            return cache
        ids = block_ids[: -(-n // self.spec["block_size"])]
        for layer, name in enumerate(self.spec["layers"]):
            t = self.kv[name]
            k, v = (kvreplay.block_rows(self.spec, t, kv, ids)[:n].transpose(0, 1)[None].contiguous()
                    for kv in (0, 1))
            cache.update(k, v, layer)
        return cache

    def scatter(self, cache, block_ids, start: int, end: int) -> None:
        bs = self.spec["block_size"]
        for layer, name in enumerate(self.spec["layers"]):
            t, c = self.kv[name], cache.layers[layer]
            for kv, src in ((0, c.keys), (1, c.values)):
                for j in range(start, end):
                    t[kvreplay.row_index(self.spec, kv, block_ids[j // bs], j % bs)].copy_(src[0, :, j])

    def forward(self, w: dict) -> None:
        cache = self.gather(w["block_ids"], w["start"])
        logits = run_model(self.model, cache, w["tokens"][w["start"]:w["end"]])
        self.scatter(cache, w["block_ids"], w["start"], w["end"])
        self.logits.setdefault(w["req_id"], []).append((w["end"], logits.cpu()))

    def check(self, refs: dict):
        """The replay's check of a finished load: its rows against the
        reference's computed KV, byte for byte."""

        def check(c: dict):
            ref = refs[c["req_id"]]["prefix"]
            got = self.gather(c["block_ids"], c["end"])
            bad = []
            for layer in range(len(self.spec["layers"])):
                for kv, a, b in ((0, got.layers[layer].keys, ref.layers[layer].keys),
                                 (1, got.layers[layer].values, ref.layers[layer].values)):
                    for j in range(c["start"], c["end"]):
                        if not torch_equal_bytes(a[0, :, j], b[0, :, j]):
                            bad.append(f"layer {layer} {'KV'[kv]} token {j}")
            return bad

        return check


def torch_equal_bytes(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def model_references(model, rec: dict, first: int, greedy_tokens: int) -> dict:
    """Per request loaded from step `first` on: its prefix computed without the
    Manager (the recorded writes of the request that computed and saved those
    tokens, in their chunks, cut at the loaded length), the logits of its later
    writes over that, `greedy_tokens` greedy tokens after them, and a one-pass
    prefill of its whole prompt."""
    import orbitkv.transformers as okt
    from transformers import DynamicCache

    writes = [(i, w) for i, st in enumerate(rec["steps"]) for w in st["writes"]]
    before = {w["req_id"] for i, w in writes if i < first}
    refs = {}
    for st in rec["steps"][first:]:
        for c in st["checks"]:
            req, n = c["req_id"], c["end"]
            if req in before:
                raise SystemExit(f"FAIL: request {req} runs before the first load: the recording "
                                 "cannot be split into a saving and a loading instance")
            saver = next((w["req_id"] for i, w in writes if i < first and w["end"] >= n
                          and w["tokens"][:n] == c["tokens"][:n]), None)
            if saver is None:
                raise SystemExit(f"FAIL: no request before step {first} computed the {n} tokens "
                                 f"{req} loads")
            prefix = DynamicCache(config=model.config)
            for i, w in writes:
                if w["req_id"] == saver and i < first and prefix.get_seq_length() < n:
                    assert w["start"] == prefix.get_seq_length(), f"{saver}'s writes are not contiguous"
                    run_model(model, prefix, w["tokens"][w["start"]:w["end"]])
            if prefix.get_seq_length() > n:
                prefix.crop(n - prefix.get_seq_length())  # drop what the saver computed past n
            cache = okt.clone_cache(prefix, model.config)
            later = [w for i, w in writes if w["req_id"] == req and i >= first]
            if not later or later[0]["start"] != n:
                raise SystemExit(f"FAIL: {req}'s first write after its load does not start at {n}")
            logits = [(w["end"], run_model(model, cache, w["tokens"][w["start"]:w["end"]]).cpu())
                      for w in later]
            last = later[-1]
            greedy = okt.greedy(model, cache, logits[-1][1].to(next(model.parameters()).device),
                                greedy_tokens)
            one = run_model(model, DynamicCache(config=model.config), later[0]["tokens"][:later[0]["end"]])
            refs[req] = dict(prefix=prefix, logits=logits, greedy=greedy, one_pass=one.cpu(),
                             last=last)
    if not refs:
        raise SystemExit("FAIL: the recording loads nothing after step {first}")
    return refs


def model_replay(rec: dict, model, refs: dict, first: int, layout: str, args, sock: str,
                 allocate, ready, log: Path) -> str:
    """One layout: the saving instance, then the loading one on fresh tensors.
    Returns the PASS details; raises AssertionError on a mismatch."""
    import orbitkv.transformers as okt
    from real_model_gate import one_pass_tolerance, rel_l2

    from orbitkv.vllm.config import ConnectorConfig
    from orbitkv.vllm.layout import describe_kv_caches
    from orbitkv.vllm.worker import WorkerCore

    cfg = model.config
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    spec = dict(rec["spec"], layout=layout, dtype=dtype, num_kv_heads=cfg.num_key_value_heads,
                head_size=cfg.head_dim,
                layers=[f"model.layers.{i}.self_attn.attn" for i in range(cfg.num_hidden_layers)])
    ns = rec["namespace"] + f"|gate=model-{args.model}-{layout}"
    stats, result, paged = {}, {}, None
    for phase, steps in (("save", slice(0, first)), ("load", slice(first, None))):
        kv = kvreplay.make_kv_caches(spec, args.device, allocate)  # fresh, zeroed
        desc = describe_kv_caches(kv, spec["num_blocks"])
        core = WorkerCore(ConnectorConfig(socket_path=sock), ns, 0)
        core.register(desc)
        if core._client is None:
            raise AssertionError(f"{phase}: registration failed (see {log})")
        paged = PagedModel(model, spec, kv)
        try:
            result[phase] = kvreplay.replay(rec, core, kv, ready=ready, layout=layout,
                                            forward=paged.forward, check=paged.check(refs), steps=steps)
            for k, v in core.take_stats().items():
                stats[k] = stats.get(k, 0) + v
        finally:
            core.close()
    # The loading instance's (paged, the last phase's) logits after its restore, and
    # decoding on from its KV.
    tol, worst, tokens = one_pass_tolerance(model), 0.0, 0
    for req, ref in refs.items():
        got = paged.logits.get(req, [])
        if [e for e, _ in got] != [e for e, _ in ref["logits"]]:
            raise AssertionError(f"{req}: computed {[e for e, _ in got]}, expected {[e for e, _ in ref['logits']]}")
        for (end, a), (_, b) in zip(got, ref["logits"]):
            if not torch_equal_bytes(a, b):
                raise AssertionError(f"{req}: logits after {end} tokens differ from computing the prefix "
                                     f"(max |d| {float((a - b).abs().max()):.3g})")
        last = ref["last"]
        cache = paged.gather(last["block_ids"], last["end"])
        greedy = okt.greedy(model, cache, got[-1][1].to(next(model.parameters()).device),
                            len(ref["greedy"]))
        if greedy != ref["greedy"]:
            first_diff = next(j for j, (a, b) in enumerate(zip(greedy, ref["greedy"])) if a != b)
            raise AssertionError(f"{req}: greedy tokens from the restored KV differ from step {first_diff}")
        d = rel_l2(got[0][1], ref["one_pass"])
        if d > tol:
            raise AssertionError(f"{req}: logits {d:.3g} (relative L2) from a one-pass prefill, tolerance {tol}")
        worst, tokens = max(worst, d), tokens + len(greedy)
    restored = stats["restored_blocks_dram"] + stats["restored_blocks_ssd"]
    if restored == 0 or stats["load_failed_blocks"]:
        raise AssertionError(f"restored {restored} blocks, {stats['load_failed_blocks']} failed")
    return (f"model={args.model} layers={len(spec['layers'])} dtype={dtype} "
            f"checked_tokens={result['load']['checked_tokens']} restored_blocks={restored} "
            f"saved_blocks={stats['saved_blocks']} logits=identical greedy_tokens={tokens}/{tokens} "
            f"rel_l2_vs_one_pass={worst:.2e}")


def mamba_replay(path: str, device: str, sock: str, allocate, ready, log: Path) -> str:
    """The Mamba hybrid recording on `device`; the PASS details, or AssertionError."""
    from orbitkv.vllm.config import ConnectorConfig
    from orbitkv.vllm.worker import WorkerCore

    rec = json.loads(Path(path).read_text())
    kv, layout, description = kvreplay.mamba_worker_inputs(rec, device, allocate)
    core = WorkerCore(ConnectorConfig(socket_path=sock), rec["namespace"] + "|gate=mamba", 0,
                      description=description)
    core.register(layout)
    if core._client is None:
        raise AssertionError(f"registration failed (see {log})")
    try:
        result = kvreplay.replay(rec, core, kv, ready=ready)
        stats = core.take_stats()
    finally:
        core.close()
    restored = stats["restored_blocks_dram"] + stats["restored_blocks_ssd"]
    if restored == 0 or stats["load_failed_blocks"] or result["load_steps"] == 0:
        raise AssertionError(f"restored {restored} pieces, {stats['load_failed_blocks']} failed")
    states = [s for s in layout.slots if s.group == 1]
    return (f"layout=mamba_hybrid device={layout.device} regions={len(layout.region_bytes)} "
            f"slots={len(layout.slots)} state_slots={len(states)} "
            f"state_bytes={layout.block_bytes(1)} steps={result['steps']} "
            f"checked_tokens={result['checked_tokens']} restored_pieces={restored} "
            f"restored_bytes={stats['restored_bytes']} saved_pieces={stats['saved_blocks']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manager", required=True, help="orbitkv-cache-manager (a CUDA build)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N, or host to check the script on CPU")
    ap.add_argument("--fixture", default=str(HERE.parent / "vllm" / "fixtures" / "worker_replay.json"))
    ap.add_argument("--mamba-fixture",
                    default=str(HERE.parent / "vllm" / "fixtures" / "worker_replay_mamba.json"),
                    help="the full attention + Mamba recording ('' skips its replay)")
    ap.add_argument("--ssd-dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--model", choices=["tiny", "qwen3-400m"],
                    help="a real model's forward (real_model_gate.py's) instead of the stand-in")
    args = ap.parse_args(argv)

    import torch

    from orbitkv.vllm.config import ConnectorConfig
    from orbitkv.vllm.layout import describe_kv_caches, host_tensor
    from orbitkv.vllm.worker import WorkerCore

    host = args.device == "host"  # the same replay on host tensors: checks this script on CPU
    if not host and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77

    rec = json.loads(Path(args.fixture).read_text())
    model = refs = None
    first = kvreplay.first_load_step(rec)
    if args.model:
        from real_model_gate import build_model, steps

        top = max(t for st in rec["steps"] for w in st["writes"] for t in w["tokens"])
        model = build_model("cpu" if host else args.device, args.model == "tiny", min_vocab=top + 1)
        refs = model_references(model, rec, first, steps(args.model == "tiny"))
    work = Path(tempfile.mkdtemp(prefix="orbitkv-vllm-gate-", dir=args.ssd_dir))
    sock, log = str(work / "m.sock"), work / "manager.log"
    cmd = [args.manager, "--socket", sock, "--metrics-port", "0", "--pool-size", "256mib",
           "--ssd-cache-path", str(work / "cache.bin"), "--ssd-cache-capacity", "1gib"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    failed = False
    try:
        wait_listening(sock, proc, log)
        if host:
            allocate, ready = host_tensor, None
        else:
            torch.cuda.set_device(torch.device(args.device))
            ready = torch.cuda.synchronize
            allocate = lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=args.device)  # noqa: E731
        for layout in kvreplay.LAYOUTS:
            if model is not None:
                try:
                    print(f"PASS layout={layout} device={args.device} "
                          + model_replay(rec, model, refs, first, layout, args, sock, allocate, ready, log),
                          flush=True)
                except AssertionError as e:
                    print(f"FAIL layout={layout} model={args.model}: {e}", flush=True)
                    failed = True
                continue
            spec = dict(rec["spec"], layout=layout)
            kv = kvreplay.make_kv_caches(spec, args.device, allocate)
            desc = describe_kv_caches(kv, spec["num_blocks"])
            core = WorkerCore(ConnectorConfig(socket_path=sock), rec["namespace"] + f"|gate={layout}", 0)
            core.register(desc)
            if core._client is None:
                print(f"FAIL layout={layout}: registration failed (see {log})")
                failed = True
                continue
            try:
                result = kvreplay.replay(rec, core, kv, ready=ready, layout=layout)
                stats = core.take_stats()
                print(f"PASS layout={layout} device={desc.device} regions={len(desc.region_bytes)} "
                      f"slots={len(desc.slots)} steps={result['steps']} "
                      f"checked_tokens={result['checked_tokens']} "
                      f"restored_blocks={stats['restored_blocks_dram'] + stats['restored_blocks_ssd']} "
                      f"saved_blocks={stats['saved_blocks']}")
            except AssertionError as e:
                print(f"FAIL layout={layout}: {e}")
                failed = True
            finally:
                core.close()
        if args.mamba_fixture:
            try:
                print("PASS " + mamba_replay(args.mamba_fixture, args.device, sock, allocate,
                                             ready, log), flush=True)
            except AssertionError as e:
                print(f"FAIL layout=mamba_hybrid: {e}", flush=True)
                failed = True
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode not in (0, None):
            print(f"FAIL: the Manager exited with {proc.returncode}:\n{log.read_text()}")
            failed = True
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
