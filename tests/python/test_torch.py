"""orbitkv.torch against a real Manager: layouts derived from tensor shapes and
strides, host tensors through OrbitKV memory, byte-exact publish/restore
between instances of different layouts, clear errors, lifetimes. CUDA cases
run where a GPU is present (the H200 gate runs this file too) and skip here.
The whole file skips without torch."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import orbitkv  # noqa: E402
import orbitkv.torch as okt  # noqa: E402

from test_client import keys  # noqa: E402

P, L, B, H, D = 8, 3, 4, 2, 8  # pages, layers, tokens per page, heads, head dim
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def fill(tensors, seed):
    g = torch.Generator().manual_seed(seed)
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))


def test_import_orbitkv_does_not_import_torch():
    code = "import sys, orbitkv; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_layout_of_per_layer_tensors():
    ts = okt.host_tensors((P, 2, B, H, D), torch.bfloat16, count=L)
    tl = okt.derive_layout(ts, page_dim=0)
    assert tl.device == "host" and tl.num_pages == P and tl.dtype == torch.bfloat16
    page = 2 * B * H * D * 2
    assert list(tl.layout.region_bytes) == [P * page] * L
    g = tl.layout.groups[0]
    assert g.num_slots == L and list(g.slot_bytes) == [page] * L
    assert [(s.region, s.offset, s.page_stride) for s in g.slots] == [(r, 0, page) for r in range(L)]
    assert tl.slot_ids == [(i, ()) for i in range(L)] and tl.page_bytes == L * page


def test_layout_of_one_tensor_with_a_layer_dimension():
    (t,) = okt.host_tensors((L, 2, P, B, H, D), torch.float16)
    tl = okt.derive_layout(t, page_dim=2)
    g = tl.layout.groups[0]
    page = B * H * D * 2
    assert len(tl.layout.region_bytes) == 1 and g.num_slots == 2 * L
    assert [s.offset for s in g.slots] == [k * P * page for k in range(2 * L)]
    assert all(s.page_stride == page and s.bytes_per_page == page for s in g.slots)
    assert tl.slot_ids[:3] == [(0, (0, 0)), (0, (0, 1)), (0, (1, 0))]


def test_views_in_one_allocation_share_a_region():
    # One buffer [P, L, 2, B, H, D] sliced per layer: strided views, page stride L pages.
    (big,) = okt.host_tensors((P, L, 2, B, H, D), torch.bfloat16)
    views = [big[:, l] for l in range(L)]
    tl = okt.derive_layout(views, page_dim=0)
    layer = 2 * B * H * D * 2
    assert len(tl.layout.region_bytes) == 1
    assert [(s.region, s.offset, s.page_stride) for s in tl.layout.groups[0].slots] == [
        (0, l * layer, L * layer) for l in range(L)
    ]
    # A view that starts inside the allocation keeps its offset.
    inner = big[2:]
    tl2 = okt.derive_layout([inner[:, 0]], page_dim=0)
    assert tl2.layout.groups[0].slots[0].offset == 2 * L * layer


def test_publish_restore_across_layouts(manager):
    """A publishes from one [L, 2, P, ...] tensor (page_dim 2), B restores into
    per-layer [2, P, ...] tensors (page_dim 1): same slots, same order."""
    with manager.client() as client:
        (a,) = okt.host_tensors((L, 2, P, B, H, D), torch.bfloat16)
        fill([a], seed=1)
        b = okt.host_tensors((2, P, B, H, D), torch.bfloat16, count=L)
        with okt.register_tensors(client, "t/across", 0, a, page_dim=2) as ra, \
                okt.register_tensors(client, "t/across", 0, b, page_dim=1) as rb:
            ks = keys("across", range(3))
            pub = ra.publish(ks, [5, 1, 6])
            assert pub.sealed == 3
            q = rb.query(ks)
            assert q.prefix == 3 and q.sources == ["dram"] * 3
            res = rb.restore(q.query, [0, 1, 2], [0, 7, 3])
            assert all(r.ok for r in res), res
            for l in range(L):
                for src, dst in [(5, 0), (1, 7), (6, 3)]:
                    assert torch.equal(b[l][:, dst], a[l][:, src])
            assert torch.count_nonzero(b[0][:, 1]) == 0  # untouched page


def test_storage_codec_reaches_the_manager(manager):
    """register_tensors(storage_codec=, head_dim=) asks the Manager for the
    codec with the tensors' dtype: a lossy codec over float32 is refused (no
    codec dtype), over bf16 it registers, and the codec is part of the
    namespace (a raw instance of the same name does not see its objects)."""
    assert [okt.codec_dtype(d) for d in (torch.bfloat16, torch.float16, torch.float32)] == \
        ["bf16", "fp16", ""]
    with manager.client() as client:
        f32 = okt.host_tensors((P, 2, B, H, D), torch.float32, count=L)
        with pytest.raises(orbitkv.InvalidArgumentError, match="needs the KV element dtype"):
            okt.register_tensors(client, "t/codec", 0, f32, storage_codec="fp8", head_dim=D)
        a = okt.host_tensors((P, 2, B, H, D), torch.bfloat16, count=L)
        b = okt.host_tensors((P, 2, B, H, D), torch.bfloat16, count=L)
        fill(a, seed=4)
        with okt.register_tensors(client, "t/codec", 0, a, storage_codec="fp8", head_dim=D) as ra, \
                okt.register_tensors(client, "t/codec", 0, b) as raw:
            assert ra.storage_codec == "fp8" and raw.storage_codec == ""
            ks = keys("codec", range(2))
            assert ra.publish(ks, [0, 1]).sealed == 2
            assert raw.query(ks).prefix == 0
            assert ra.query(ks).prefix == 2


def test_registration_keeps_tensors_alive(manager):
    """Dropping every tensor while registered frees nothing; unregister
    releases the memory (the HostPages goes with its last tensor)."""
    with manager.client() as client:
        ts = okt.host_tensors((P, 2, B, H, D), torch.float32, count=2)
        fill(ts, seed=2)
        expected = [t[3].clone() for t in ts]
        reg = okt.register_tensors(client, "t/alive", 0, ts)
        addresses = [t.data_ptr() for t in ts]
        pages_refs = [okt._host_pages[a] for a in addresses]
        reg.publish(keys("alive", [0]), [3])
        del ts
        gc.collect()
        assert all(r() is not None and not r().closed for r in pages_refs)
        q = reg.query(keys("alive", [0]))
        assert [r.ok for r in reg.restore(q.query, [0], [6])] == [True]
        assert all(torch.equal(t[6], e) for t, e in zip(reg.tensors, expected))
        reg.unregister()
        gc.collect()
        assert all(r() is None for r in pages_refs)  # unmapped after unregister
        assert not any(a in okt._host_pages for a in addresses)
        with pytest.raises(orbitkv.FailedPreconditionError):
            reg.publish(keys("alive", [1]), [0])
        reg.unregister()  # idempotent
        # The Manager is fine and serves the block to a new registration.
        ts2 = okt.host_tensors((P, 2, B, H, D), torch.float32, count=2)
        with okt.register_tensors(client, "t/alive", 0, ts2) as reg2:
            q = reg2.query(keys("alive", [0]))
            assert q.prefix == 1
            assert reg2.restore(q.query, [0], [1])[0].ok
            assert all(torch.equal(t[1], e) for t, e in zip(ts2, expected))


def test_closing_the_client_unregisters(manager):
    client = manager.client()
    ts = okt.host_tensors((P, 2, B, H, D), torch.float32, count=1)
    reg = okt.register_tensors(client, "t/close", 0, ts)
    client.close()
    reg.unregister()  # no error: the closed client already unregistered it
    assert reg.closed and reg.tensors == ()


def test_errors_are_clear():
    (t,) = okt.host_tensors((P, 2, B, H, D), torch.bfloat16)
    plain = torch.zeros(P, 2, B, H, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="arbitrary CPU tensors cannot be shared.*host_tensors"):
        okt.derive_layout([plain])
    with pytest.raises(ValueError, match="several devices"):
        okt.derive_layout([t, torch.zeros(P, 2, B, H, D, dtype=torch.bfloat16, device="meta")])
    with pytest.raises(ValueError, match="only cuda:N and cpu"):
        okt.derive_layout([torch.zeros(P, 4, device="meta")])
    (u,) = okt.host_tensors((P, B, 2, H, D), torch.bfloat16)
    with pytest.raises(ValueError, match="inner part.*not contiguous"):
        okt.derive_layout([u.transpose(1, 2)])  # [P, 2, B, H, D] with B, 2 swapped
    (f,) = okt.host_tensors((P, 2, B, H, D), torch.float16)
    with pytest.raises(ValueError, match="different dtypes"):
        okt.derive_layout([t, f])
    (short,) = okt.host_tensors((P - 1, 2, B, H, D), torch.bfloat16)
    with pytest.raises(ValueError, match="7 pages along dim 0, but tensors\\[0\\] has 8"):
        okt.derive_layout([t, short])
    with pytest.raises(ValueError, match="pages would overlap"):
        okt.derive_layout([t[:1].expand(P, 2, B, H, D)])
    with pytest.raises(ValueError, match="same byte as another slot"):
        okt.derive_layout([t, t])
    with pytest.raises(ValueError, match="page_dim 5 out of range"):
        okt.derive_layout([t], page_dim=5)
    with pytest.raises(TypeError, match=r"tensors\[0\] must be a torch.Tensor"):
        okt.derive_layout([b"x"])
    with pytest.raises(ValueError, match="no tensors"):
        okt.derive_layout([])


def test_parse_ipc_handle_forms():
    raw = bytes(range(64))
    assert okt.parse_ipc_handle(raw) == raw
    assert okt.parse_ipc_handle(b"\x02c" + raw) == raw  # torch 2.11: version, 'c', handle
    with pytest.raises(ValueError, match="expandable_segments"):
        okt.parse_ipc_handle(b"\x02e" + bytes(100))
    with pytest.raises(ValueError, match="unrecognised"):
        okt.parse_ipc_handle(bytes(10))


@needs_cuda
def test_cuda_tensors_roundtrip_and_views(manager):
    """Per-layer views of one CUDA allocation (one region, offsets of views)
    and a separate tensor; A publishes, B (new tensors) restores."""
    dev = torch.device("cuda", 0)
    with manager.client() as client:
        big = torch.empty((P, L, 2, B, H, D), dtype=torch.bfloat16, device=dev)
        fill([big], seed=3)
        a = [big[:, l] for l in range(L)]
        b = [torch.zeros((P, 2, B, H, D), dtype=torch.bfloat16, device=dev) for _ in range(L)]
        with okt.register_tensors(client, "t/cuda", 0, a) as ra, \
                okt.register_tensors(client, "t/cuda", 0, b) as rb:
            assert ra.device == "cuda:0" and len(ra.layout.region_bytes) == 1
            ks = keys("cuda", range(2))
            assert ra.publish(ks, [4, 2]).sealed == 2
            q = rb.query(ks)
            assert q.prefix == 2
            assert all(r.ok for r in rb.restore(q.query, [0, 1], [0, 5]))
            for l in range(L):
                assert torch.equal(b[l][0], a[l][4]) and torch.equal(b[l][5], a[l][2])


@needs_cuda
def test_pinned_host_tensors():
    ts = okt.host_tensors((P, 64), torch.float32, count=1, pin=True)
    assert ts[0].is_pinned()
    ts[0].fill_(3.0)
    assert torch.equal(ts[0].cuda(non_blocking=True).cpu(), ts[0])
