"""orbitkv Python binding against a real Manager (see conftest.py)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

import orbitkv


def key(ns: str, i: int) -> bytes:
    return hashlib.sha256(f"{ns}/{i}".encode()).digest()


def keys(ns: str, ids) -> list[bytes]:
    return [key(ns, i) for i in ids]


class Engine:
    """Host pages of one layout plus numpy views of every slot of every page."""

    def __init__(self, layout: orbitkv.InstanceLayout, seed: int = 0):
        self.layout = layout
        self.regions = orbitkv.allocate_regions(layout)
        self.arrays = [r.numpy() for r in self.regions]  # writable uint8 views
        self.slots = list(layout.groups[0].slots)
        self.rng = np.random.default_rng(seed)

    def slot(self, slot: orbitkv.SlotLayout, page: int) -> np.ndarray:
        off = slot.page_offset(page)
        return self.arrays[slot.region][off : off + slot.bytes_per_page]

    def fill(self, page: int) -> list[bytes]:
        """Random bytes in every slot of `page`; returns them per slot."""
        out = []
        for s in self.slots:
            data = self.rng.integers(0, 256, s.bytes_per_page, dtype=np.uint8)
            self.slot(s, page)[:] = data
            out.append(data.tobytes())
        return out

    def read(self, page: int) -> list[bytes]:
        return [self.slot(s, page).tobytes() for s in self.slots]

    def clear(self, page: int) -> None:
        for s in self.slots:
            self.slot(s, page)[:] = 0

    def register(self, client: orbitkv.Client, ns: str) -> int:
        return client.register_instance(ns, 0, "host", self.layout, self.regions)


def make_layout(kind: str, pages: int, sizes) -> orbitkv.InstanceLayout:
    return (orbitkv.split_layout if kind == "split" else orbitkv.page_first_layout)(pages, sizes)


# ---- host pages and layouts (no Manager) ----------------------------------------


def test_host_pages_are_sealed_memfds_with_writable_views():
    with orbitkv.HostPages(1 << 16) as p:
        assert p.size == len(p) == 1 << 16
        seals = fcntl.fcntl(p.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
        assert os.readlink(f"/proc/self/fd/{p.fd}").startswith("/memfd:orbitkv-pages")
        arr = p.numpy()
        assert arr.flags.writeable and arr.dtype == np.uint8 and arr.size == p.size
        arr[100:104] = [1, 2, 3, 4]
        mv = memoryview(p)
        assert not mv.readonly and bytes(mv[100:104]) == b"\x01\x02\x03\x04"
        mv[0] = 7
        assert arr[0] == 7
        assert os.pread(p.fd, 4, 100) == b"\x01\x02\x03\x04"  # the memfd holds the bytes
        assert np.frombuffer(p, dtype=np.float32).size == p.size // 4
        with pytest.raises(BufferError):
            p.close()  # views are alive
        mv.release()
        del arr
    assert p.closed
    with pytest.raises(ValueError):
        _ = p.fd
    with pytest.raises(ValueError):
        memoryview(p)
    with pytest.raises(ValueError):
        orbitkv.HostPages(0)


def test_layout_helpers_and_live_lists():
    split = orbitkv.split_layout(16, [1000, 333])
    assert split.num_pages == 16
    assert split.region_bytes == [16000, 16 * 333]
    g = split.groups[0]
    assert (g.group_id, g.num_slots, g.slot_bytes) == (0, 2, [1000, 333])
    assert g.slots[1] == orbitkv.SlotLayout(1, 1, 0, 333, 333)
    split.validate()

    pf = orbitkv.page_first_layout(8, [1000, 333, 7], group_id=3)
    assert pf.region_bytes == [8 * 1340]
    assert [s.offset for s in pf.groups[0].slots] == [0, 1000, 1333]
    assert all(s.page_stride == 1340 and s.region == 0 for s in pf.groups[0].slots)
    assert pf.groups[0].slots[2].page_offset(2) == 2 * 1340 + 1333
    assert pf.groups[0].group_id == 3
    pf.validate()

    # List fields are live: in-place edits change the layout.
    pf.groups[0].slots[2].offset = 1 << 40
    with pytest.raises(orbitkv.InvalidArgumentError, match="group 3 slot 2"):
        pf.validate()
    g = orbitkv.GroupLayout(group_id=1, slot_bytes=[64])
    assert g.num_slots == 1 and g.slots == []
    g.slots.append(orbitkv.SlotLayout(0, 0, 0, 64, 64))
    inst = orbitkv.InstanceLayout(4, [256], [g])
    inst.validate()
    assert "SlotLayout(slot_id=0" in repr(inst)
    inst.groups.append("not a group")
    with pytest.raises(TypeError):
        inst.validate()


# ---- publish / query / restore ---------------------------------------------------


@pytest.mark.parametrize("kind", ["split", "page_first"])
@pytest.mark.parametrize("sizes", [[1000, 333, 4096, 70], [333], [1000, 333]])
def test_restore_is_byte_exact(client, kind, sizes):
    layout = make_layout(kind, 16, sizes)
    eng = Engine(layout, seed=len(sizes))
    ns = f"{kind}-{sizes}"
    inst = eng.register(client, ns)
    written = [eng.fill(p) for p in range(4)]
    pr = client.publish(inst, 0, keys(ns, range(4)), [0, 1, 2, 3])
    assert (pr.stored, pr.sealed, pr.skipped) == (4, 4, 0)
    assert client.publish(inst, 0, keys(ns, [0]), [0]).skipped == 1  # already present

    q = client.query(inst, 0, keys(ns, range(5)))
    assert q.prefix == 4 and q.query != 0
    assert q.sources == ["dram"] * 4
    assert q.logical_bytes >= 4 * sum(sizes)
    assert q.budget_limited is False

    for p in range(8, 13):
        eng.clear(p)
    results = client.restore(inst, q.query, [0, 1, 2, 3], [8, 9, 10, 11])
    assert [r.block for r in results] == [0, 1, 2, 3]
    for r in results:
        assert r.ok and r and r.error == "" and r.code == "OK" and r.source == "dram", r
        r.raise_for_error()
    for i in range(4):
        assert eng.read(8 + i) == written[i], f"page {8 + i}"
    assert eng.read(12) == [bytes(s) for s in sizes]  # neighbours untouched
    assert eng.read(7) == [bytes(s) for s in sizes]
    client.unregister_instance(inst)


def test_fragmented_publication_seals_when_complete(client):
    eng = Engine(orbitkv.split_layout(8, [512, 1000, 7]))
    inst = eng.register(client, "frag")
    written = eng.fill(0)
    k = keys("frag", [9])
    r = client.publish(inst, 0, k, [0], slot_ids=[0])
    assert (r.stored, r.sealed) == (1, 0)
    assert client.query(inst, 0, k).prefix == 0  # invisible while assembling
    assert client.publish(inst, 0, k, [0], [2]).sealed == 0
    assert client.query(inst, 0, k).prefix == 0
    assert client.publish(inst, 0, k, [0], [1]).sealed == 1
    q = client.query(inst, 0, k)
    assert q.prefix == 1
    (res,) = client.restore(inst, q.query, [0], [5])
    assert res.ok, res.error
    assert eng.read(5) == written


def test_release_query_frees_its_sources(client):
    eng = Engine(orbitkv.split_layout(8, [4000]))
    inst = eng.register(client, "release")
    eng.fill(0)
    k = keys("release", [1])
    assert client.publish(inst, 0, k, [0]).sealed == 1
    q = client.query(inst, 0, k)
    assert q.prefix == 1
    client.release_query(inst, q.query)
    with pytest.raises(orbitkv.NotFoundError):
        client.restore(inst, q.query, [0], [1])  # released: nothing left to restore
    with pytest.raises(orbitkv.NotFoundError):
        client.release_query(inst, q.query)


def test_restore_from_ssd_after_dram_eviction(start_manager):
    mgr = start_manager(pool_size="2mib")  # ~30 objects of 64 KiB
    ns = "ssd"
    with mgr.client() as client:
        eng = Engine(orbitkv.split_layout(64, [32768, 32768 - 100]), seed=7)
        inst = eng.register(client, ns)
        written = {}

        def publish(i: int, page: int, deadline: float) -> None:
            # The pool refuses (skips) while every entry waits for writeback.
            while True:
                r = client.publish(inst, 0, [key(ns, i)], [page])
                if r.sealed == 1:
                    return
                assert time.monotonic() < deadline, f"publish {i} kept being skipped: {r}"
                time.sleep(0.01)

        deadline = time.monotonic() + 60
        for i in range(48):
            written[i] = eng.fill(i)
            publish(i, i, deadline)

        # Wait until blocks 0-3 were written back and evicted from DRAM; publish
        # more (to other keys) to push them out if needed.
        want = keys(ns, range(4))
        filler = 1000
        while True:
            q = client.query(inst, 0, want, ttl_ms=50)
            if q.prefix == 4 and q.sources == ["ssd"] * 4:
                break
            assert time.monotonic() < deadline, f"never evicted to SSD: {q}"
            publish(filler, 4 + filler % 40, deadline)
            filler += 1
            time.sleep(0.01)

        for p in range(60, 64):
            eng.clear(p)
        results = client.restore(inst, q.query, [0, 1, 2, 3], [60, 61, 62, 63])
        for r in results:
            assert r.ok and r.source == "ssd", r
        for i in range(4):
            assert eng.read(60 + i) == written[i], f"block {i}"

        # Prepare warms SSD objects back into DRAM.
        assert 0 <= client.prepare(inst, 0, want) <= 4
        # Data in SSD files under the temp dir (disk-backed /var/tmp).
        assert any(f.stat().st_size > 0 for f in mgr.ssd_dir.iterdir())


def test_storage_codec_at_register(client):
    """The storage codec is asked for at register and is part of the namespace."""
    eng = Engine(orbitkv.split_layout(8, [65536]), seed=3)
    with pytest.raises(orbitkv.InvalidArgumentError, match="unknown storage codec 'zstd'"):
        client.register_instance("codec", 0, "host", eng.layout, eng.regions,
                                 storage_codec="zstd")
    with pytest.raises(orbitkv.InvalidArgumentError, match="needs the KV element dtype"):
        client.register_instance("codec", 0, "host", eng.layout, eng.regions,
                                 storage_codec="fp8")
    ans = client.register_instance("codec", 0, "host", eng.layout, eng.regions,
                                   storage_codec="ans")
    fp8 = client.register_instance("codec", 0, "host", eng.layout, eng.regions,
                                   storage_codec="fp8", kv_dtype="bf16", head_dim=128)
    plain = eng.register(client, "codec")
    eng.fill(0)
    assert client.publish(ans, 0, [key("codec", 1)], [0]).sealed == 1
    assert client.query(ans, 0, [key("codec", 1)]).prefix == 1
    for other in (fp8, plain):
        assert client.query(other, 0, [key("codec", 1)]).prefix == 0
    for inst in (ans, fp8, plain):
        client.unregister_instance(inst)


# ---- errors -------------------------------------------------------------------


def test_repeated_keys_are_charged_once_and_ttl_is_capped(client):
    eng = Engine(orbitkv.split_layout(8, [4000]))
    inst = eng.register(client, "budget")
    k = keys("budget", [1])
    eng.fill(0)
    client.publish(inst, 0, k, [0])
    one = client.query(inst, 0, k)
    many = client.query(inst, 0, k * 1000)
    assert many.prefix == 1000 and not many.budget_limited
    assert many.logical_bytes == one.logical_bytes  # one key, charged once
    assert "budget_limited=False" in repr(many)
    with pytest.raises(orbitkv.InvalidArgumentError, match="--max-query-ttl-ms"):
        client.query(inst, 0, k, ttl_ms=60001)
    client.release_query(inst, one.query)
    client.release_query(inst, many.query)
    client.unregister_instance(inst)


def test_typed_errors_on_bad_input(client):
    eng = Engine(orbitkv.split_layout(8, [4000]))
    inst = eng.register(client, "errors")
    k = keys("errors", [1])

    with pytest.raises(ValueError, match="exactly 32 bytes") as e:
        client.publish(inst, 0, [b"short"], [0])
    assert not isinstance(e.value, orbitkv.OrbitKVError)
    with pytest.raises(ValueError):
        client.query(inst, 0, [bytes(33)])
    with pytest.raises(TypeError):
        client.query(inst, 0, ["a" * 32])
    with pytest.raises(TypeError):
        client.query(inst, 0, bytes(32))  # one key, not a list of keys
    with pytest.raises(ValueError, match="one page per key"):
        client.publish(inst, 0, k, [0, 1])
    with pytest.raises(ValueError):
        client.publish(inst, 0, k, [-1])

    with pytest.raises(orbitkv.InvalidArgumentError) as e:
        client.publish(inst, 0, k, [8])  # 8 pages: 0..7
    err = e.value
    assert isinstance(err, orbitkv.OrbitKVError) and isinstance(err, ValueError)
    assert err.code == "InvalidArgument" and not err.retryable
    assert str(err).startswith("InvalidArgument: ") and "out of range" in str(err)

    with pytest.raises(orbitkv.InvalidArgumentError):
        client.publish(inst, 0, k, [0], slot_ids=[5])  # slot not held
    with pytest.raises(orbitkv.NotFoundError) as e:
        client.publish(inst + 100, 0, k, [0])
    assert e.value.code == "NotFound"
    with pytest.raises(orbitkv.NotFoundError):
        client.query(inst + 100, 0, k)
    with pytest.raises(orbitkv.NotFoundError):
        client.restore(inst, 12345, [0], [1])  # unknown query

    client.publish(inst, 0, k, [0])
    q = client.query(inst, 0, k)
    with pytest.raises(orbitkv.InvalidArgumentError):
        client.restore(inst, q.query, [0], [99])  # page out of range
    with pytest.raises(orbitkv.OrbitKVError):
        client.restore(inst, q.query, [1], [1])  # beyond the prefix
    (ok,) = client.restore(inst, q.query, [0], [1])  # the query survived
    assert ok.ok

    # Register: region too small, not a sealed memfd.
    bad = orbitkv.split_layout(8, [4000])
    bad.region_bytes = [64000]
    with pytest.raises(orbitkv.InvalidArgumentError):
        client.register_instance("errors", 0, "host", bad, eng.regions)
    with open("/dev/null", "rb") as devnull:
        with pytest.raises(orbitkv.OrbitKVError):
            client.register_instance("errors", 0, "host", eng.layout, [devnull])
    with pytest.raises(TypeError):
        client.register_instance("errors", 0, "host", eng.layout, ["region"])

    client.unregister_instance(inst)
    with pytest.raises(orbitkv.NotFoundError):
        client.publish(inst, 0, k, [0])
    with pytest.raises(orbitkv.NotFoundError):
        client.unregister_instance(inst)


def test_connect_to_missing_socket_raises_unavailable(tmp_path):
    with pytest.raises(orbitkv.UnavailableError):
        orbitkv.Client(str(tmp_path / "nobody.sock"))


def test_cancel_unknown_ticket_and_tickets(client):
    t1, t2 = client.new_ticket(), client.new_ticket()
    assert t2 > t1 > 0
    assert client.cancel_restore(t1) is False
    assert client.cancel_restore(987654321) is False


def test_close_then_call_raises(manager):
    client = manager.client()
    eng = Engine(orbitkv.split_layout(4, [512]))
    inst = eng.register(client, "close")
    assert not client.closed
    client.close()
    assert client.closed
    with pytest.raises(orbitkv.FailedPreconditionError, match="closed"):
        client.query(inst, 0, keys("close", [0]))
    with pytest.raises(orbitkv.OrbitKVError):
        client.new_ticket()
    client.close()  # idempotent
    # The session's instances went with it.
    with manager.client() as other:
        with pytest.raises(orbitkv.NotFoundError):
            other.publish(inst, 0, keys("close", [0]), [0])


# ---- the GIL ----------------------------------------------------------------------


def test_gil_released_while_waiting_for_a_reply(tmp_path):
    # A "Manager" that accepts and never answers: Client() blocks in the Hello
    # exchange until its timeout. Another Python thread must run meanwhile.
    path = str(tmp_path / "silent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    t = threading.Thread(target=ticker)
    try:
        t.start()
        time.sleep(0.05)
        start = time.monotonic()
        with pytest.raises(orbitkv.DeadlineExceededError) as e:
            orbitkv.Client(path, timeout_ms=1000)
        end = time.monotonic()
        assert isinstance(e.value, TimeoutError)
        assert end - start >= 0.9
        during = [x for x in ticks if start + 0.1 < x < end - 0.1]
        assert len(during) >= 20, f"only {len(during)} ticks while blocked: GIL held?"
    finally:
        stop.set()
        t.join()
        srv.close()


def test_concurrent_restores_from_two_threads(client):
    ns = "threads"
    eng = Engine(orbitkv.split_layout(64, [4096, 1000]), seed=3)
    inst = eng.register(client, ns)
    written = [eng.fill(p) for p in range(8)]
    assert client.publish(inst, 0, keys(ns, range(8)), list(range(8))).sealed == 8
    errors = []

    def worker(base: int):
        try:
            for it in range(25):
                q = client.query(inst, 0, keys(ns, range(8)))
                assert q.prefix == 8
                dest = [base + b for b in range(8)]
                for r in client.restore(inst, q.query, list(range(8)), dest):
                    assert r.ok, r.error
                for b in range(8):
                    assert eng.read(base + b) == written[b]
                    eng.clear(base + b)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(base,)) for base in (16, 32, 48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- connection state, limits and restore timeouts --------------------------------


def test_closed_is_true_once_the_manager_dies(manager):
    client = manager.client()
    assert not client.closed
    manager.kill()
    deadline = time.monotonic() + 5
    while not client.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.closed, "Client.closed stayed False after the Manager died"
    with pytest.raises(orbitkv.OrbitCancelledError):
        client.query(1, 0, keys("dead", [0]))


def test_limits_raise_their_typed_reason(start_manager):
    m = start_manager(extra=["--max-connections", "1", "--idle-timeout-ms", "800"])
    # The fixture's readiness probe may still hold the one slot for a moment.
    deadline = time.monotonic() + 5
    while True:
        try:
            first = m.client()
            break
        except orbitkv.ResourceExhaustedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    with pytest.raises(orbitkv.ResourceExhaustedError, match="--max-connections"):
        m.client()
    # Idle without an instance: closed by the Manager, with its reason.
    time.sleep(1.5)
    assert first.closed
    with pytest.raises(orbitkv.DeadlineExceededError, match="--idle-timeout-ms"):
        first.query(1, 0, keys("idle", [0]))


def stop_process(pid: int) -> None:
    """SIGSTOP, and wait until every thread of `pid` is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not stop: {states}")


# orbitkv/__init__.py (packaging) re-exports it once merged; the module has it.
RestoreStillOwnedError = getattr(
    orbitkv, "RestoreStillOwnedError", orbitkv._orbitkv.RestoreStillOwnedError
)


def test_restore_timeout_raises_still_owned_until_wait_restore(manager):
    client = manager.client(timeout_ms=1000, restore_cancel_grace_ms=500)
    ns = "stalled"
    eng = Engine(orbitkv.split_layout(8, [4096, 1000]), seed=5)
    inst = eng.register(client, ns)
    written = eng.fill(0)
    assert client.publish(inst, 0, keys(ns, [0]), [0]).sealed == 1
    q = client.query(inst, 0, keys(ns, [0]))
    mine = eng.fill(1)  # the engine's own bytes in the destination page
    stop_process(manager.proc.pid)
    try:
        ticket = client.new_ticket()
        start = time.monotonic()
        with pytest.raises(RestoreStillOwnedError) as e:
            client.restore(inst, q.query, [0], [1], ticket=ticket)
        assert time.monotonic() - start >= 1.4  # timeout, then the cancel grace
        assert isinstance(e.value, orbitkv.DeadlineExceededError)
        assert e.value.ticket == ticket
        assert "wait" in str(e.value).lower()
        assert eng.read(1) == mine, "written while the Manager was stopped?" + str(
            eng.read(1) == written
        )
    finally:
        os.kill(manager.proc.pid, signal.SIGCONT)
    results = client.wait_restore(ticket, timeout_ms=10000)
    assert len(results) == 1
    expected = written if results[0].ok else mine
    assert eng.read(1) == expected
    time.sleep(0.3)
    assert eng.read(1) == expected, "a page was written after wait_restore returned"
    with pytest.raises(orbitkv.InvalidArgumentError):
        client.wait_restore(ticket, timeout_ms=100)
