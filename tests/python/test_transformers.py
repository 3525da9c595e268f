"""orbitkv.transformers on the CPU: a tiny random Qwen3 through a real Manager
(host instances), and the real-model gate script in its tiny CPU mode (the
same processes and checks the H200 runs, cuFile aside). Skips without
torch/transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import orbitkv.transformers as okt  # noqa: E402

GATE = Path(__file__).resolve().parents[1] / "gpu" / "real_model_gate.py"
VLLM_WORKER_GATE = Path(__file__).resolve().parents[1] / "gpu" / "vllm_worker_gate.py"


def tiny_model(layers=2, seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, tie_word_embeddings=True)
    cfg._name_or_path = "tiny-test"
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).eval()


def test_block_keys_chain_and_namespace():
    ids = list(range(50))
    k = okt.block_keys("ns", ids)
    assert len(k) == 3 and all(len(x) == 32 for x in k)
    assert okt.block_keys("ns", ids[:32]) == k[:2]  # a key names its whole prefix
    assert okt.block_keys("ns", [1] + ids[1:])[1] != k[1]  # an earlier block changes later keys
    assert okt.block_keys("other", ids) != k
    a, b = tiny_model(2), tiny_model(3)
    assert okt.namespace(a) != okt.namespace(b)  # config hash
    assert okt.namespace(a) != okt.namespace(tiny_model(2).to(torch.bfloat16))  # dtype
    assert okt.namespace(a) == okt.namespace(tiny_model(2, seed=1))
    assert okt.namespace(a).endswith("/float32/devices=1")


def test_restored_prefix_gives_identical_logits(manager):
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 128, (80,), generator=g).tolist()  # 5 blocks
    suffix = torch.randint(0, 128, (21,), generator=g).tolist()
    with manager.client() as c1, okt.PrefixCache(model, c1, num_pages=3, chunk_tokens=32) as p1:
        r1 = p1.prefill(prefix, restore=False)
        assert r1.published == 5 and r1.computed_tokens == 80
        ref_cache = okt.clone_cache(r1.cache, model.config)
        ref_logits = p1.extend(ref_cache, suffix)
        ref_tokens = okt.greedy(model, ref_cache, ref_logits, 8)
    # A new client and new pages (3 pages: the 5 blocks restore in two rounds).
    with manager.client() as c2, okt.PrefixCache(model, c2, num_pages=3, chunk_tokens=32) as p2:
        r2 = p2.prefill(prefix + suffix)
        assert (r2.restored_tokens, r2.computed_tokens) == (80, 21)
        assert r2.sources == {"dram": 5} and r2.errors == []
        assert torch.equal(r2.logits, ref_logits)
        assert okt.greedy(model, r2.cache, r2.logits, 8) == ref_tokens
        assert r2.published == 1  # the suffix's one whole block
        # The whole prompt cached: the last token is still computed.
        r3 = p2.prefill(prefix + suffix[:16])
        assert (r3.restored_tokens, r3.computed_tokens) == (80, 16)
        r4 = p2.prefill(prefix + suffix[:16])
        assert (r4.restored_tokens, r4.computed_tokens) == (80, 16)
        full = p2.prefill(prefix + suffix, restore=False, publish=False)
        assert float((full.logits - r2.logits).abs().max()) < 1e-4


def test_unsupported_models_are_refused(manager):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      layer_types=["full_attention", "sliding_attention"], sliding_window=32,
                      use_sliding_window=True)
    with manager.client() as c, pytest.raises(ValueError, match="full-attention layers only"):
        okt.PrefixCache(Qwen3ForCausalLM(cfg), c)


def test_real_model_gate_tiny_on_cpu(manager_binary, tmp_path):
    """tests/gpu/real_model_gate.py end to end on the CPU: producer and consumer
    processes, DRAM, SSD after eviction, Manager restart, a corrupted object."""
    out = subprocess.run(
        [sys.executable, str(GATE), "--device", "cpu", "--tiny", "--manager", manager_binary,
         "--workdir", str(tmp_path / "gate"), "--json", str(tmp_path / "gate.json")],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "REAL-MODEL GATE PASSED: dram, ssd-uring, restart, corrupt" in out.stdout


def test_real_model_gate_codecs_tiny_on_cpu(manager_binary, tmp_path):
    """The gate's codec phase on the CPU (tiny Qwen3 in bf16): per storage codec
    the prefix is published through a Manager whose namespace uses it, evicted
    from DRAM, restored from the encoded SSD copy in a fresh process; ans (and
    none) give bit-identical logits over the greedy steps, the lossy codecs
    perturb them (KL > 0, finite) but keep top-1 agreement, and the Manager's
    encode counters give their compression ratio."""
    import json

    report = tmp_path / "codecs.json"
    out = subprocess.run(
        [sys.executable, str(GATE), "--device", "cpu", "--tiny", "--manager", manager_binary,
         "--scenarios", "", "--codecs", "none,ans,fp8,turboquant-4,turboquant-3",
         "--workdir", str(tmp_path / "gate"), "--json", str(report)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "REAL-MODEL GATE PASSED: codecs none,ans,fp8,turboquant-4,turboquant-3" in out.stdout
    rows = {r["codec"]: r for r in json.loads(report.read_text())["codecs"]}
    assert list(rows) == ["none", "ans", "fp8", "turboquant-4", "turboquant-3"]
    for r in rows.values():
        assert r["prompts"] == 2 and r["steps"] == 16, r
    for c in ("none", "ans"):
        assert rows[c]["identical"] and rows[c]["kl_max"] == 0 and rows[c]["top1"] == 1, rows[c]
        assert rows[c]["kv_rel_mse"] == {"k": 0.0, "v": 0.0}, rows[c]
    assert rows["none"]["encoded_in"] == 0 and rows["ans"]["ratio"] > 1.0, rows
    # The lossy codecs' KV came back decoded (not the raw DRAM copy): logits
    # move, and more at fewer bits.
    for c, floor, ratio in (("fp8", 0.9, 1.8), ("turboquant-4", 0.75, 3.0), ("turboquant-3", 0.6, 3.8)):
        r = rows[c]
        assert not r["identical"] and 0 < r["kl_mean"] <= r["kl_max"] < float("inf"), r
        assert 0 < r["kv_rel_mse"]["k"] and 0 < r["kv_rel_mse"]["v"], r
        assert r["top1"] >= floor and r["ratio"] > ratio, r
        assert r["encoded_in"] >= 16 * 32768, r  # the 16 prefix blocks of 32 KiB, encoded
    assert rows["fp8"]["kl_mean"] < rows["turboquant-3"]["kl_mean"], rows
    assert rows["fp8"]["kv_rel_mse"]["k"] < rows["turboquant-4"]["kv_rel_mse"]["k"] < \
        rows["turboquant-3"]["kv_rel_mse"]["k"], rows


def test_vllm_worker_gate_real_model_tiny_on_cpu(manager_binary, tmp_path, capsys):
    """tests/gpu/vllm_worker_gate.py --model tiny on host tensors (in this process,
    which has torch and transformers imported already): the recorded vLLM plans
    drive the connector's worker side with the real-model gate's tiny Qwen3 as
    the forward; the prefix saved by one worker instance and restored by
    another into fresh vLLM-layout tensors gives logits and greedy tokens
    identical to computing it, in every vLLM KV layout; and the Mamba hybrid
    recording's replay (stand-in forward) restores attention blocks and the
    checkpoint byte for byte."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_worker_gate", VLLM_WORKER_GATE)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    rc = gate.main(["--device", "host", "--model", "tiny", "--manager", manager_binary,
                    "--ssd-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    passed = [line for line in out.splitlines() if line.startswith("PASS ")]
    assert [line.split()[1] for line in passed] == [
        "layout=kv_first", "layout=block_first", "layout=hnd", "layout=mamba_hybrid"], out
    for line in passed[:3]:
        assert "model=tiny" in line and "logits=identical" in line and "restored_blocks=4" in line
    assert "state_slots=4" in passed[3] and "restored_pieces=7" in passed[3], out


def test_example_chat_restores_earlier_turns(manager_binary):
    """examples/transformers_chat.py on the CPU: every turn after the first
    restores what the earlier turns computed."""
    example = Path(__file__).resolve().parents[2] / "examples" / "transformers_chat.py"
    import os

    env = dict(os.environ, ORBITKV_MANAGER_BINARY=manager_binary)
    out = subprocess.run(
        [sys.executable, str(example), "--device", "cpu", "--system-tokens", "200",
         "--answer-tokens", "8"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 3], out.stdout
    prompt = [int(r[1]) for r in rows]
    restored = [int(r[2]) for r in rows]
    computed = [int(r[3]) for r in rows]
    assert restored[0] == 0 and computed[0] == prompt[0]
    for i in (1, 2):
        # The previous prompt and its answer (8 tokens, the last never fed back),
        # in whole 16-token blocks, come back.
        assert restored[i] >= ((prompt[i - 1] + 7) // 16) * 16, out.stdout
        assert restored[i] + computed[i] == prompt[i]


def test_prefix_larger_than_query_budget_restores_whole(start_manager):
    """A prefix larger than the Manager's query byte budget (the DRAM pool):
    the first query is budget_limited, and PrefixCache follows it with queries
    for the rest of the chain instead of recomputing it (the H200 gate's SSD
    scenarios restored 95 of 256 blocks before this)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=128, hidden_size=128, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                      head_dim=64, tie_word_embeddings=True)
    cfg._name_or_path = "tiny-budget"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()  # 128 KiB of KV per 16-token block
    m = start_manager("2mib")  # with an SSD cache (the fixture's)
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 128, (48 * 16,), generator=g).tolist()  # 48 blocks, 6 MiB
    with m.client() as c1, okt.PrefixCache(model, c1, num_pages=8, chunk_tokens=128) as p1:
        r1 = p1.prefill(prefix, restore=False)
        assert r1.published == 48
        ref = p1.extend(okt.clone_cache(r1.cache, model.config), [5])
    with m.client() as c2, okt.PrefixCache(model, c2, num_pages=8, chunk_tokens=128) as p2:
        first = p2.query(okt.block_keys(p2.ns, prefix))
        assert first.budget_limited and 0 < first.prefix < 48, first
        p2.reg.release_query(first.query)
        r2 = p2.prefill(prefix + [5])
        assert r2.errors == [] and r2.restored_tokens == 48 * 16, (r2.sources, r2.restored_tokens)
        assert r2.budget_continuations >= 1
        assert torch.equal(r2.logits, ref)
