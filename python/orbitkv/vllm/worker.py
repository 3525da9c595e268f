"""The connector's worker side, without vLLM: restore and publish vLLM blocks.

:class:`WorkerCore` owns one Manager connection and one registered instance
(one TP/PP rank's KV cache, see :mod:`orbitkv.vllm.layout`). It executes the
:class:`~orbitkv.vllm.plan.StepPlan` of every step: loads run on a loader
thread (query the keys on this instance, restore the hits into the planned
blocks), saves on a saver thread (publish complete blocks once the step's
forward is done). Completion is reported through :meth:`get_finished` and
failed blocks through :meth:`take_load_errors`, so vLLM recomputes them.

Threads: vLLM's model-runner thread calls the public methods; the two
executor threads run the Manager calls (which release the GIL). State shared
with them is guarded by ``_mu``. A Manager that is down, restarts or times
out fails the affected loads (their blocks are load errors) and drops saves;
nothing raises into vLLM after :meth:`register`. Reconnection (and
re-registration) is tried at most every ``retry_interval_s``.

Hybrid models (a model description: the instance has one storage group per
KV cache group): a load queries the request's chain from block 0 and restores
the recovery plan's pieces, each into its own group's block (attention
blocks of vLLM's local hit are left alone); a load that cannot restore its
whole plan fails as a whole (vLLM's hybrid scheduler takes failed requests,
not block ids: :meth:`take_failed_loads`). Saves publish into the save's
group. Before a step's forward the earlier saves of sliding-window and
recurrent (Mamba) groups are done: vLLM hands window blocks that left the
window to other requests, and a Mamba state block holds the offered state only
until the next forward (vLLM frees or rewrites it). A recurrent piece (the
checkpoint after P tokens) is restored into block P / block_tokens - 1 of its
group, the block vLLM allocates for the state a hit resumes from.
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

import orbitkv
from orbitkv._chain import take_prefix

from .config import ConnectorConfig
from .layout import KVLayout
from orbitkv.hybrid import GroupKind, ModelDescription

from .plan import LoadSpec, SaveSpec, StepPlan

log = logging.getLogger("orbitkv.vllm")


class WorkerStats:
    """Counters since the last take(): blocks and bytes restored per tier, saved, failed."""

    FIELDS = (
        "restored_blocks_dram",
        "restored_blocks_ssd",
        "restored_bytes",
        "load_failed_blocks",
        "saved_blocks",
        "saved_bytes",
        "save_skipped_blocks",
        "save_dropped_blocks",
        "save_failed_blocks",
    )

    def __init__(self) -> None:
        self.values = dict.fromkeys(self.FIELDS, 0)

    def add(self, name: str, n: int) -> None:
        self.values[name] += n


class WorkerCore:
    def __init__(
        self,
        config: ConnectorConfig,
        namespace: str,
        rank: int,
        client_factory: Optional[Callable[[], "orbitkv.Client"]] = None,
        description: Optional[ModelDescription] = None,
    ) -> None:
        self.cfg = config
        self.description = description
        self.namespace = namespace
        self.rank = rank
        self._client_factory = client_factory or (
            lambda: orbitkv.Client(
                config.resolved_socket_path(),
                timeout_ms=config.io_timeout_ms,
                client_name=f"vllm-worker-{rank}",
            )
        )
        self._mu = threading.Lock()
        self._layout: Optional[KVLayout] = None
        self._client: Optional[orbitkv.Client] = None
        self._instance = 0
        self._next_retry = 0.0
        self._block_bytes = 0
        # Guarded by _mu.
        self._loads: Dict[str, futures.Future] = {}  # req_id -> load in flight or done
        self._async_loads: Set[str] = set()  # loads reported through finished_recving
        self._saves: Dict[str, List[futures.Future]] = collections.defaultdict(list)
        self._delayed: Set[str] = set()  # finished requests waiting for finished_sending
        self._load_errors: Set[int] = set()
        self._failed_loads: Set[str] = set()  # hybrid loads that failed (whole requests)
        # Saves the next forward waits for: of groups whose blocks vLLM reuses
        # after the step (sliding windows, recurrent state).
        self._window_saves: List[futures.Future] = []
        self._window_groups: Set[int] = {
            g.storage_group for g in (description.groups if description else ())
            if g.kind in (GroupKind.SLIDING_WINDOW, GroupKind.RECURRENT)}
        self._stats = WorkerStats()
        self._step_loads: List[futures.Future] = []  # sync loads of the current step
        self._loader = futures.ThreadPoolExecutor(1, thread_name_prefix="orbitkv-load")
        self._saver = futures.ThreadPoolExecutor(1, thread_name_prefix="orbitkv-save")
        self._window_saver = futures.ThreadPoolExecutor(1, thread_name_prefix="orbitkv-save-window")

    # ---- registration --------------------------------------------------------

    def register(self, layout: KVLayout) -> None:
        """Registers the KV cache with the Manager (or later, when it is down)."""
        self._layout = layout
        self._block_bytes = layout.block_bytes()
        if not self._connect():
            log.warning(
                "OrbitKV: no Manager at %s yet; the KV cache registers when it answers",
                self.cfg.resolved_socket_path(),
            )

    def _connect(self) -> bool:
        """A live client and instance, connecting and registering if needed."""
        with self._mu:
            if self._client is not None:
                return True
            if self._layout is None or time.monotonic() < self._next_retry:
                return False
        try:
            client = self._client_factory()
            lay = self._layout
            extra = {} if self.description is None else {"model": self.description}
            inst = client.register_instance(
                self.namespace,
                self.rank,
                lay.device,
                lay.instance_layout(),
                lay.host_regions if lay.device == "host" else [],
                lay.ipc_handles if lay.device != "host" else None,
                **extra,
            )
        except (orbitkv.OrbitKVError, OSError) as e:
            self._failed(f"register {self.namespace}: {e}")
            return False
        with self._mu:
            self._client, self._instance = client, inst
        log.info("OrbitKV: registered %s (%d blocks of %d bytes, %s)",
                 self.namespace, lay.num_blocks, self._block_bytes, lay.device)
        return True

    def _failed(self, what: str, client: Optional["orbitkv.Client"] = None) -> None:
        """A Manager call failed: drop the connection, back off."""
        log.warning("OrbitKV: %s; Manager calls pause for %.1f s", what, self.cfg.retry_interval_s)
        with self._mu:
            if client is None or client is self._client:
                old, self._client, self._instance = self._client, None, 0
            else:
                old = None
            self._next_retry = time.monotonic() + self.cfg.retry_interval_s
        if old is not None:
            try:
                old.close()
            except orbitkv.OrbitKVError:
                pass  # closing a dead connection: nothing left to release

    def _session(self) -> Tuple[Optional["orbitkv.Client"], int]:
        if not self._connect():
            return None, 0
        with self._mu:
            return self._client, self._instance

    # ---- loads -----------------------------------------------------------------

    def start_load(self, plan: StepPlan) -> None:
        """Submits the plan's loads; remembers its delayed-free requests. A sync
        plan's loads are waited for here, before the forward (vLLM skips
        wait_for_layer_load when it replays a CUDA graph)."""
        with self._mu:
            self._delayed.update(plan.delayed_free)
            self._step_loads = []
            for spec in plan.loads:
                f = self._loader.submit(self._load, spec)
                self._loads[spec.req_id] = f
                if plan.sync_load:
                    self._step_loads.append(f)
                else:
                    self._async_loads.add(spec.req_id)
        if plan.sync_load:
            self.wait_for_layer_load()

    def wait_for_layer_load(self) -> None:
        """Blocks until this step's synchronous loads are done (no-op for async ones)."""
        with self._mu:
            pending, self._step_loads = self._step_loads, []
        futures.wait(pending)

    def _load(self, spec: LoadSpec) -> None:
        if spec.hybrid:
            ok = False
            try:
                ok = self._restore_plan(spec)
            except Exception as e:  # never into vLLM: the request is recomputed
                log.warning("OrbitKV: load of %s failed: %s", spec.req_id, e)
            if not ok:
                with self._mu:
                    self._failed_loads.add(spec.req_id)
                    self._stats.add("load_failed_blocks",
                                    spec.prefix_tokens // self._block_tokens() - spec.skip_blocks)
            return
        failed = set(spec.block_ids)
        try:
            failed = self._restore(spec)
        except Exception as e:  # never into vLLM: the blocks are recomputed
            log.warning("OrbitKV: load of %s failed: %s", spec.req_id, e)
        with self._mu:
            self._load_errors.update(failed)
            self._stats.add("load_failed_blocks", len(failed))

    def _block_tokens(self) -> int:
        return self.description.key_block_tokens if self.description is not None else 1

    def _restore_plan(self, spec: LoadSpec) -> bool:
        """Hybrid: restores the recovery plan of the prefix `spec.prefix_tokens`
        into each piece's group; True if every needed piece was restored."""
        client, inst = self._session()
        if client is None:
            return False
        d = self.description
        kinds = {g.storage_group: g for g in d.groups}
        try:
            q = client.query(inst, 0, spec.keys, ttl_ms=self.cfg.query_ttl_ms)
        except (orbitkv.OrbitKVError, OSError) as e:
            self._failed(f"restore for {spec.req_id}: {e}", client)
            return False
        try:
            if q.prefix_tokens < spec.prefix_tokens:
                log.warning("OrbitKV: the Manager restores %d tokens of %s, %d were planned",
                            q.prefix_tokens, spec.req_id, spec.prefix_tokens)
                return False
            pieces, pages = [], []
            for i, p in enumerate(q.pieces):
                g = kinds[p.storage_group]
                if g.kind == GroupKind.RECURRENT:
                    block = p.index // g.block_tokens - 1  # the state after p.index tokens
                else:
                    block = p.index * g.block_tokens // d.key_block_tokens
                    if block < spec.skip_blocks:
                        continue  # vLLM's local hit holds it
                ids = spec.group_block_ids[p.storage_group]
                if block >= len(ids) or ids[block] == spec.null_block:
                    log.warning("OrbitKV: %s group %d piece %d has no block allocated",
                                spec.req_id, p.storage_group, p.index)
                    return False
                pieces.append(i)
                pages.append(ids[block])
            results = client.restore(inst, q.query, pieces, pages) if pieces else []
        except (orbitkv.OrbitKVError, OSError) as e:
            self._failed(f"restore for {spec.req_id}: {e}", client)
            return False
        finally:
            try:
                if q.prefix:  # a query without pieces holds nothing (and is not live)
                    client.release_query(inst, q.query)
            except (orbitkv.OrbitKVError, OSError):
                pass  # consumed, or the connection is gone (handled above)
        good = [r for r in results if r.ok]
        for r in results:
            if not r.ok:
                log.warning("OrbitKV: piece %d of the load of %s not restored: %s",
                            r.block, spec.req_id, r.error)
        by_tier = collections.Counter(q.pieces[pieces[j]].tier for j in range(len(pieces))
                                      if results[j].ok)
        with self._mu:
            self._stats.add("restored_blocks_dram", by_tier["dram"])
            self._stats.add("restored_blocks_ssd", by_tier["ssd"])
            self._stats.add("restored_bytes", sum(q.pieces[pieces[j]].bytes
                                                  for j in range(len(pieces)) if results[j].ok))
        return len(good) == len(pieces)

    def _restore(self, spec: LoadSpec) -> Set[int]:
        """Restores what the Manager has; returns the blocks left unrestored.

        A query cut by the Manager's query byte budget is followed, once its
        blocks are restored, by one for the rest of the keys
        (orbitkv._chain.take_prefix); the walk stops at the first failed block.
        Blocks restored before a Manager call failed stay restored."""
        client, inst = self._session()
        if client is None:
            return set(spec.block_ids)
        restored: Dict[int, str] = {}  # index in spec -> tier

        def take(q, base: int) -> int:
            n = q.prefix
            try:
                pages = spec.block_ids[base : base + n]
                results = client.restore(inst, q.query, list(range(n)), pages)
            finally:
                try:
                    client.release_query(inst, q.query)
                except orbitkv.NotFoundError:
                    pass  # the restore consumed every source: nothing left to release
            good = n
            for r in results:
                if r.ok:
                    restored[base + r.block] = r.source
                else:
                    good = min(good, r.block)
                    log.warning("OrbitKV: block %d of the load of %s (vLLM block %d) not "
                                "restored: %s", base + r.block, spec.req_id,
                                spec.block_ids[base + r.block], r.error)
            return good

        try:
            ttl = self.cfg.query_ttl_ms
            take_prefix(spec.keys, lambda rest: client.query(inst, 0, rest, ttl_ms=ttl), take)
        except (orbitkv.OrbitKVError, OSError) as e:
            self._failed(f"restore for {spec.req_id}: {e}", client)
        by_tier = collections.Counter(restored.values())
        with self._mu:
            self._stats.add("restored_blocks_dram", by_tier["dram"])
            self._stats.add("restored_blocks_ssd", by_tier["ssd"])
            self._stats.add("restored_bytes", len(restored) * self._block_bytes)
        return {b for i, b in enumerate(spec.block_ids) if i not in restored}

    # ---- saves -----------------------------------------------------------------

    def save(self, plan: StepPlan, ready: Optional[Callable[[], None]] = None) -> None:
        """Publishes the plan's saves on the saver thread after `ready()` returns
        (e.g. a CUDA event's synchronize: the step's forward wrote the blocks)."""
        if not plan.saves:
            return
        with self._mu:
            for spec in plan.saves:
                window = spec.group in self._window_groups
                # Window saves have their own thread: the next forward waits for
                # them, not for the full-attention saves queued before them.
                f = (self._window_saver if window else self._saver).submit(self._save, spec, ready)
                self._saves[spec.req_id].append(f)
                if window:
                    self._window_saves.append(f)

    def _save(self, spec: SaveSpec, ready: Optional[Callable[[], None]]) -> None:
        client = None
        try:
            if ready is not None:
                ready()
            client, inst = self._session()
            if client is None:
                raise ConnectionError("no Manager")
            r = client.publish(inst, spec.group, spec.keys, spec.block_ids)
        except Exception as e:  # never into vLLM: a dropped save only costs later hits
            if client is not None and isinstance(e, (orbitkv.OrbitKVError, OSError)):
                self._failed(f"save for {spec.req_id}: {e}", client)
            elif client is not None:
                log.warning("OrbitKV: save of %s failed: %s", spec.req_id, e)
            with self._mu:
                self._stats.add("save_failed_blocks", len(spec.keys))
            return
        with self._mu:
            self._stats.add("saved_blocks", r.stored)
            self._stats.add("saved_bytes", r.stored * self._group_bytes(spec.group))
            self._stats.add("save_skipped_blocks", r.skipped)
            self._stats.add("save_dropped_blocks", r.dropped)

    def _group_bytes(self, group: int) -> int:
        if self._layout is None or self.description is None:
            return self._block_bytes
        return self._layout.block_bytes(group)

    def handle_preemptions(self, plan: StepPlan) -> None:
        """Waits for the saves of the plan's preempted requests: vLLM hands their
        blocks to other requests in this step's forward; and for the saves of
        sliding-window and recurrent groups (vLLM frees blocks that left the
        window, and frees or rewrites state blocks)."""
        with self._mu:
            pending = [f for r in plan.preempted for f in self._saves.get(r, ())]
            self._window_saves = [f for f in self._window_saves if not f.done()]
            pending += self._window_saves
        futures.wait(pending)

    def wait_for_saves(self, timeout: Optional[float] = None) -> bool:
        """Waits for every submitted save (tests, shutdown). True if all finished."""
        with self._mu:
            pending = [f for fs in self._saves.values() for f in fs]
        done, not_done = futures.wait(pending, timeout=timeout)
        return not not_done

    # ---- completion ------------------------------------------------------------

    def get_finished(self) -> Tuple[Set[str], Set[str]]:
        """(finished_sending, finished_recving) since the last call.

        finished_recving: requests whose asynchronous load ended (restored or
        failed; failed blocks are in take_load_errors()). finished_sending:
        the plans' delayed_free requests (the scheduler kept their blocks),
        once no save or load of theirs is in flight.
        """
        with self._mu:
            recving = set()
            for req_id in list(self._async_loads):
                if self._loads[req_id].done():
                    recving.add(req_id)
                    self._async_loads.discard(req_id)
            for req_id, f in list(self._loads.items()):
                if f.done() and req_id not in self._async_loads:
                    del self._loads[req_id]
            for req_id, fs in list(self._saves.items()):
                fs[:] = [f for f in fs if not f.done()]
                if not fs:
                    del self._saves[req_id]
            sending = set()
            for req_id in list(self._delayed):
                if req_id not in self._saves and req_id not in self._loads:
                    sending.add(req_id)
                    self._delayed.discard(req_id)
        return sending, recving

    def take_failed_loads(self, finished: Set[str]) -> Set[str]:
        """The hybrid loads among `finished` (get_finished's finished_recving) that failed."""
        with self._mu:
            failed = self._failed_loads & set(finished)
            self._failed_loads -= failed
        return failed

    def take_load_errors(self) -> Set[int]:
        with self._mu:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def take_stats(self) -> Dict[str, int]:
        with self._mu:
            stats, self._stats = self._stats, WorkerStats()
        return stats.values

    def busy(self) -> bool:
        with self._mu:
            return bool(self._loads or self._saves)

    def close(self) -> None:
        """Finishes queued work, unregisters and closes the connection."""
        self._loader.shutdown(wait=True)
        self._saver.shutdown(wait=True)
        self._window_saver.shutdown(wait=True)
        with self._mu:
            client, inst, self._client = self._client, self._instance, None
        if client is not None:
            try:
                client.unregister_instance(inst)
            except orbitkv.OrbitKVError:
                pass  # the Manager went away: the instance went with the session
            client.close()
