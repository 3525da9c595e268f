// copy_latency_bench: where the time of a DRAM -> HBM restore goes below the
// Manager (issue 18's p50 <= 100 us target, and the per-call rate of large
// restores). --objects blocks as the pinned pool holds them (each a 4 KiB
// header, then --slots segments of --slot-bytes, placed at scattered offsets
// of a region mapped, locked and registered as the Manager maps its pool:
// mmap + MADV_HUGEPAGE + mlock + HostMemoryHooks) are copied into
// objects x slots device pages at scattered offsets, --iters times, by:
//   memcpy-1      one cudaMemcpyAsync per whole object + event sync (the ceiling)
//   memcpy-slots  one cudaMemcpyAsync per slot + event sync (the naive baseline)
//   batch/128     EnqueueEngineCopies (cudaMemcpyBatchAsync, 128 ops a call) + event sync
//   batch/ramp-N  the same, the first call N ops, each next twice the last
//   batch1/src-M  one cudaMemcpyBatchAsync of every op, sources read in stream
//                 order or in any order (cudaMemcpySrcAccessOrderAny)
//   platform/M    CudaDevice::CreateEvent + CopyAsync + Record + Wait, exactly the
//                 Manager's Instance::CopyAndWait, with ORBITKV_GPU_COPY=M
// (--gap-us N: N us idle before each iteration, calls spaced as a Manager's are;
// --gap-spin: the thread spins through the gap instead of sleeping, so its core
// stays awake; --keepalive-us K: another thread copies 64 bytes to the GPU
// every K us for the whole run, so the link and the copy engines see traffic
// between iterations: which of the two an idle gap's cost comes from;
// --to-host: the other way, HBM pages -> the pool's objects, as Publish copies;
// --ipc-pages: the platform rows' pages are one allocation per slot, made by a
// child process and opened here with Device::OpenIpc, as a Manager opens an
// engine's regions, instead of one local allocation; --extra-ipc N: N more
// such mappings opened and not copied to, as other instances' regions are)
// printing p50/p99 of the wall time and, for the platform rows, of the
// enqueue (CreateEvent + CopyAsync + Record) apart from the wait.
// --threads N (N >= 1, with --to-host; staged mover, with the CRCs): then
// rows of N threads publishing at once, as a Manager's request threads do,
// each its 1/N of the objects, --iters jobs each pipelined --depth deep
// (default 2: the next job enqueued before the previous is waited for), on
// streams of their own (one per job in flight, as Instance::EnqueueToHost)
// or on one stream the threads share (enqueues under a mutex), printing the
// aggregate GB/s and the enqueue p50 of each (--threads-mover M: the mover
// of these rows, default staged; with --ipc-pages their pages are the IPC
// mappings too). Every
// iteration's pages are checked against the object once at the end of each
// row. A benchmark, not a test: run it on a CUDA host (h200_perf.sh runs it).
#include <cuda_runtime_api.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/copy_kernels.h"
#include "gpu/copy_options.h"
#include "gpu/cuda_platform.h"
#include "gpu/host_memory_hooks.h"

namespace {

using Clock = std::chrono::steady_clock;
using orbitkv::gpu::CopyOp;
using orbitkv::gpu::DevPtr;

// The gap before an iteration: asleep, or spinning on the clock.
void Idle(int us, bool spin) {
  if (us <= 0) return;
  if (!spin) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    return;
  }
  const auto end = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < end) {
  }
}

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Quant {
  double p50 = 0, p99 = 0;
};
Quant Q(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

#define CHECK_CUDA(x)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(3);                                                                     \
    }                                                                                   \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  uint64_t slots = 64, slot_bytes = 32 << 10, objects = 1;
  int iters = 500;
  int gap_us = 0;  // idle time between iterations (the Manager's calls are not back to back)
  uint64_t extra_ipc = 0;
  bool to_host = false, ipc_pages = false;
  int threads = 0, depth = 2;
  std::string threads_mover = "staged";
  bool gap_spin = false;
  int keepalive_us = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--to-host") to_host = true;
    if (std::string(argv[i]) == "--ipc-pages") ipc_pages = true;
    if (std::string(argv[i]) == "--gap-spin") gap_spin = true;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--to-host" || a == "--ipc-pages" || a == "--gap-spin") {
      --i;
      continue;
    }
    if (a == "--slots") slots = std::strtoull(argv[i + 1], nullptr, 10);
    if (a == "--slot-bytes") slot_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (a == "--iters") iters = std::atoi(argv[i + 1]);
    if (a == "--gap-us") gap_us = std::max(0, std::atoi(argv[i + 1]));
    if (a == "--keepalive-us") keepalive_us = std::max(0, std::atoi(argv[i + 1]));
    if (a == "--threads") threads = std::max(0, std::atoi(argv[i + 1]));
    if (a == "--threads-mover") threads_mover = argv[i + 1];
    if (a == "--depth") depth = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--extra-ipc") extra_ipc = std::strtoull(argv[i + 1], nullptr, 10);
    if (a == "--objects") objects = std::max<uint64_t>(1, std::strtoull(argv[i + 1], nullptr, 10));
  }
  // --ipc-pages: the child process that owns the pages, forked before this
  // process touches CUDA. It sends one IPC handle per slot and keeps the
  // allocations until the pipe back to it closes.
  const uint64_t ipc_region = objects * 4 * slot_bytes;  // a slot's pages, 4 apart
  std::vector<orbitkv::gpu::IpcHandle> handles;
  int release_fd = -1;
  pid_t child = -1;
  if (ipc_pages) {
    int to_parent[2], to_child[2];
    if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) return 3;
    child = ::fork();
    if (child == 0) {
      ::close(to_parent[0]);
      ::close(to_child[1]);
      if (cudaSetDevice(0) != cudaSuccess) ::_exit(3);
      for (uint64_t k = 0; k < slots + extra_ipc; ++k) {
        void* p = nullptr;
        cudaIpcMemHandle_t h;
        if (cudaMalloc(&p, ipc_region) != cudaSuccess ||
            cudaIpcGetMemHandle(&h, p) != cudaSuccess ||
            ::write(to_parent[1], &h, sizeof(h)) != static_cast<ssize_t>(sizeof(h))) {
          ::_exit(3);
        }
      }
      char c;
      while (::read(to_child[0], &c, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    release_fd = to_child[1];
    handles.resize(slots + extra_ipc);
    for (auto& h : handles) {
      size_t got = 0;
      while (got < h.size()) {
        const ssize_t n = ::read(to_parent[0], h.data() + got, h.size() - got);
        if (n <= 0) {
          std::fprintf(stderr, "copy_latency_bench: the page owner process failed\n");
          return 3;
        }
        got += static_cast<size_t>(n);
      }
    }
    ::close(to_parent[0]);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "copy_latency_bench: no CUDA device\n");
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(0));
  const uint64_t header = 4096, object = header + slots * slot_bytes;
  const uint64_t page_stride = 4 * slot_bytes;  // pages of a slot 4 apart, in random order
  const uint64_t total_slots = objects * slots;
  // Objects at scattered places of a region twice their size (in 4 KiB
  // units, as the pool's allocator places them), in a shuffled order.
  const uint64_t object_span = (object + 4095) / 4096 * 4096;
  const uint64_t host_bytes = 2 * objects * object_span;
  void* map =
      ::mmap(nullptr, host_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    std::fprintf(stderr, "copy_latency_bench: mmap of %llu bytes failed\n",
                 static_cast<unsigned long long>(host_bytes));
    return 3;
  }
  auto* host = static_cast<uint8_t*>(map);
  (void)::madvise(host, host_bytes, MADV_HUGEPAGE);
  const bool locked = ::mlock(host, host_bytes) == 0;
  // Registered as the Manager registers its pool (HostMemoryHooks:
  // cudaHostRegister, and the range the platform classifies without a driver call).
  const orbitkv::HostMemoryHooks hooks = orbitkv::GetHostMemoryHooks();
  if (!hooks.register_memory || !hooks.register_memory(host, host_bytes).ok()) {
    std::fprintf(stderr, "copy_latency_bench: registering host memory failed\n");
    return 3;
  }
  std::mt19937_64 rng(7);
  std::vector<uint64_t> place(2 * objects);
  for (uint64_t i = 0; i < place.size(); ++i) place[i] = i;
  std::shuffle(place.begin(), place.end(), rng);
  std::vector<uint8_t*> obj(objects);
  for (uint64_t o = 0; o < objects; ++o) {
    obj[o] = host + place[o] * object_span;
    for (uint64_t i = 0; i < object; ++i) obj[o][i] = static_cast<uint8_t>(rng());
  }
  uint8_t* dev = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dev), total_slots * page_stride));
  std::vector<uint64_t> order(total_slots);
  for (uint64_t s = 0; s < total_slots; ++s) order[s] = s;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<CopyOp> ops;
  auto slot_src = [&](uint64_t s) { return obj[s / slots] + header + (s % slots) * slot_bytes; };
  for (uint64_t s = 0; s < total_slots; ++s) {
    const auto page = reinterpret_cast<DevPtr>(dev + order[s] * page_stride);
    const auto pooled = reinterpret_cast<DevPtr>(slot_src(s));
    ops.push_back(to_host ? CopyOp{pooled, page, slot_bytes} : CopyOp{page, pooled, slot_bytes});
  }
  // --to-host: the pages hold what the pool holds now; the rows copy them
  // back into zeroed slots.
  auto zero_slots = [&] {
    for (uint64_t s = 0; s < total_slots; ++s) std::memset(slot_src(s), 0, slot_bytes);
  };
  std::vector<uint8_t> want;
  if (to_host) {
    for (uint64_t s = 0; s < total_slots; ++s) {
      CHECK_CUDA(cudaMemcpy(dev + order[s] * page_stride, slot_src(s), slot_bytes,
                            cudaMemcpyHostToDevice));
      want.insert(want.end(), slot_src(s), slot_src(s) + slot_bytes);
    }
    zero_slots();
  }
  auto verify = [&](const char* row) {
    if (to_host) {
      CHECK_CUDA(cudaDeviceSynchronize());
      for (uint64_t s = 0; s < total_slots; ++s) {
        if (std::memcmp(slot_src(s), want.data() + s * slot_bytes, slot_bytes) != 0) {
          std::fprintf(stderr, "copy_latency_bench: %s: WRONG BYTES in slot %llu\n", row,
                       static_cast<unsigned long long>(s));
          std::exit(1);
        }
      }
      zero_slots();
      return;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> back(slot_bytes);
    for (uint64_t s = 0; s < total_slots; ++s) {
      CHECK_CUDA(cudaMemcpy(back.data(), dev + order[s] * page_stride, slot_bytes,
                            cudaMemcpyDeviceToHost));
      if (std::memcmp(back.data(), slot_src(s), slot_bytes) != 0) {
        std::fprintf(stderr, "copy_latency_bench: %s: WRONG BYTES in slot %llu\n", row,
                     static_cast<unsigned long long>(s));
        std::exit(1);
      }
    }
    CHECK_CUDA(cudaMemset(dev, 0, total_slots * page_stride));
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  std::printf(
      "copy_latency_bench: %llu block(s) of %llu slots x %llu B (%.2f MiB in all) %s, %d "
      "iterations%s, host memory %s\n",
      static_cast<unsigned long long>(objects), static_cast<unsigned long long>(slots),
      static_cast<unsigned long long>(slot_bytes), double(total_slots * slot_bytes) / (1 << 20),
      to_host ? "HBM -> pool" : "pool -> HBM", iters,
      gap_us > 0
          ? (", " + std::to_string(gap_us) + " us idle before each" +
             (gap_spin ? " (spinning)" : "") +
             (keepalive_us > 0 ? ", 64 B to the GPU every " + std::to_string(keepalive_us) + " us"
                               : std::string()))
                .c_str()
          : "",
      locked ? "mlocked" : "not locked (mlock failed)");
  // --keepalive-us: 64 bytes to the GPU every K us, on a stream of its own,
  // until main returns.
  struct Keepalive {
    std::atomic<bool> stop{false};
    std::thread thread;
    ~Keepalive() {
      stop.store(true);
      if (thread.joinable()) thread.join();
    }
  } keepalive;
  if (keepalive_us > 0) {
    keepalive.thread = std::thread([&keepalive, keepalive_us] {
      void* h = nullptr;
      void* d = nullptr;
      cudaStream_t s = nullptr;
      CHECK_CUDA(cudaMallocHost(&h, 64));
      CHECK_CUDA(cudaMalloc(&d, 64));
      CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      while (!keepalive.stop.load()) {
        CHECK_CUDA(cudaMemcpyAsync(d, h, 64, cudaMemcpyHostToDevice, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        std::this_thread::sleep_for(std::chrono::microseconds(keepalive_us));
      }
      cudaStreamDestroy(s);
      cudaFree(d);
      cudaFreeHost(h);
    });
  }
  std::printf("  %-18s %10s %10s %14s %14s %10s\n", "path", "p50 us", "p99 us", "enqueue p50",
              "wait p50", "GB/s p50");

  cudaStream_t st = nullptr;
  cudaEvent_t ev = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  for (const char* row : {"memcpy-1", "memcpy-slots"}) {
    std::vector<double> wall;
    for (int i = 0; i < iters; ++i) {
      Idle(gap_us, gap_spin);
      const auto t0 = Clock::now();
      if (row[7] == '1') {
        for (uint64_t o = 0; o < objects; ++o) {
          if (to_host) {
            CHECK_CUDA(
                cudaMemcpyAsync(obj[o], dev + o * object_span, object, cudaMemcpyDeviceToHost, st));
          } else {
            CHECK_CUDA(
                cudaMemcpyAsync(dev + o * object_span, obj[o], object, cudaMemcpyHostToDevice, st));
          }
        }
      } else {
        for (const CopyOp& op : ops) {
          CHECK_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(op.dst),
                                     reinterpret_cast<const void*>(op.src), op.bytes,
                                     cudaMemcpyDefault, st));
        }
      }
      CHECK_CUDA(cudaEventRecord(ev, st));
      CHECK_CUDA(cudaEventSynchronize(ev));
      wall.push_back(Us(Clock::now() - t0));
    }
    if (row[7] != '1') verify(row);
    if (to_host && row[7] == '1') zero_slots();  // whole objects came back: not per slot
    const Quant w = Q(wall);
    std::printf("  %-18s %10.1f %10.1f %14s %14s %10.1f\n", row, w.p50, w.p99, "-", "-",
                double(total_slots * slot_bytes) / (w.p50 * 1e3));
  }
  if (!to_host) CHECK_CUDA(cudaMemset(dev, 0, total_slots * page_stride));

  // The copy engines' batch calls alone (EnqueueEngineCopies, as the engines
  // mover and the staged mover's direct ops enqueue them): all ops in
  // batches of at most 128, or a first batch of N and each next twice the
  // last (ORBITKV_GPU_COPY_FIRST_BATCH=N), so the first bytes move while the
  // rest are enqueued.
  {
    std::vector<orbitkv::gpu::CopyDesc> descs;
    for (const CopyOp& op : ops) descs.push_back({op.dst, op.src, op.bytes});
    // Times `enqueue` (then an event record and its wait) --iters times,
    // checks the pages, prints the row.
    const auto time_row = [&](const std::string& row, const auto& enqueue) {
      std::vector<double> wall, enq, wait;
      for (int i = 0; i < iters; ++i) {
        Idle(gap_us, gap_spin);
        const auto t0 = Clock::now();
        CHECK_CUDA(enqueue());
        CHECK_CUDA(cudaEventRecord(ev, st));
        const auto t1 = Clock::now();
        CHECK_CUDA(cudaEventSynchronize(ev));
        const auto t2 = Clock::now();
        wall.push_back(Us(t2 - t0));
        enq.push_back(Us(t1 - t0));
        wait.push_back(Us(t2 - t1));
      }
      verify(row.c_str());
      const Quant w = Q(wall), e = Q(enq), x = Q(wait);
      std::printf("  %-18s %10.1f %10.1f %14.1f %14.1f %10.1f\n", row.c_str(), w.p50, w.p99, e.p50,
                  x.p50, double(total_slots * slot_bytes) / (w.p50 * 1e3));
    };
    for (size_t first_batch : {size_t{0}, size_t{4}, size_t{8}, size_t{16}, size_t{32}}) {
      bool batched = false;
      time_row(first_batch == 0 ? "batch/128" : "batch/ramp-" + std::to_string(first_batch), [&] {
        return orbitkv::gpu::EnqueueEngineCopies(descs.data(), descs.size(), st, &batched,
                                                 first_batch);
      });
      if (!batched) std::printf("    (per op: no batch copy here)\n");
    }
#if CUDART_VERSION >= 13000
    // One cudaMemcpyBatchAsync of every op (at most 128), sources read in
    // stream order (as EnqueueEngineCopies asks) or in any order (the source
    // does not change until the copy completes): whether the relaxed order
    // makes the enqueue or the DMAs cheaper.
    if (descs.size() <= 128) {
      std::vector<void*> dsts, srcs;
      std::vector<size_t> sizes;
      for (const orbitkv::gpu::CopyDesc& c : descs) {
        dsts.push_back(reinterpret_cast<void*>(c.dst));
        srcs.push_back(reinterpret_cast<void*>(c.src));
        sizes.push_back(static_cast<size_t>(c.bytes));
      }
      for (const bool any : {false, true, false, true}) {
        cudaMemcpyAttributes attr = {};
        attr.srcAccessOrder = any ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagDefault;
        size_t attr_index = 0;
        time_row(any ? "batch1/src-any" : "batch1/src-stream", [&] {
          return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                                      &attr_index, 1, st);
        });
      }
    }
#endif
  }

  // --to-host also: staged copies then the CRC32C of every page (Publish's D2H job).
  std::vector<orbitkv::gpu::CrcOp> crc_ops;
  uint32_t* crc_out = nullptr;
  if (to_host) {
    for (uint64_t s = 0; s < total_slots; ++s) {
      crc_ops.push_back({reinterpret_cast<DevPtr>(dev + order[s] * page_stride), slot_bytes});
    }
    CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&crc_out), 4 * total_slots));
  }
  // --ipc-pages: slot s's page is in its slot's mapping, at object s / slots.
  auto ipc_page_of = [&](const std::vector<orbitkv::gpu::IpcMapping>& maps, uint64_t s) {
    return maps[s % slots].base + (s / slots) * 4 * slot_bytes;
  };
  // Opens the child's allocations on `d` and points the ops (and CRCs) at
  // those pages; to the host, the pages first get the bytes the pool's slots
  // must come back with. False when a handle does not open (printed).
  auto map_ipc_pages = [&](orbitkv::gpu::Device& d, std::vector<orbitkv::gpu::IpcMapping>* maps,
                           std::vector<CopyOp>* row_ops,
                           std::vector<orbitkv::gpu::CrcOp>* row_crcs) {
    for (const auto& h : handles) {
      auto m = d.OpenIpc(h);
      if (!m.ok()) {
        std::fprintf(stderr, "OpenIpc: %s\n", m.status().ToString().c_str());
        return false;
      }
      maps->push_back(*m);
    }
    for (uint64_t s = 0; s < total_slots; ++s) {
      const DevPtr page = ipc_page_of(*maps, s);
      if (to_host) {
        (*row_ops)[s].src = page;
        (*row_crcs)[s].data = page;
        CHECK_CUDA(cudaMemcpy(reinterpret_cast<void*>(page), want.data() + s * slot_bytes,
                              slot_bytes, cudaMemcpyHostToDevice));
      } else {
        (*row_ops)[s].dst = page;
      }
    }
    return true;
  };
  std::vector<std::string> modes = {"staged", "engines", "kernel"};
  if (to_host) modes.push_back("staged+crc");
  for (const std::string& row_mode : modes) {
    const bool with_crc = row_mode == "staged+crc";
    const char* mode = with_crc ? "staged" : row_mode.c_str();
    ::setenv(orbitkv::gpu::kGpuCopyEnv, mode, 1);
    auto platform = orbitkv::gpu::CreateCudaPlatform();
    ::unsetenv(orbitkv::gpu::kGpuCopyEnv);
    if (!platform.ok()) {
      std::fprintf(stderr, "platform: %s\n", platform.status().ToString().c_str());
      return 3;
    }
    auto device = (*platform)->device(0);
    if (!device.ok()) return 3;
    orbitkv::gpu::Device& d = **device;
    auto stream = d.CreateStream();
    if (!stream.ok()) return 3;
    std::vector<orbitkv::gpu::IpcMapping> maps;
    std::vector<CopyOp> row_ops = ops;
    std::vector<orbitkv::gpu::CrcOp> row_crcs = crc_ops;
    auto ipc_page = [&](uint64_t s) { return ipc_page_of(maps, s); };
    if (ipc_pages && !map_ipc_pages(d, &maps, &row_ops, &row_crcs)) return 3;
    std::vector<double> wall, enq, wait;
    for (int i = 0; i < iters; ++i) {
      Idle(gap_us, gap_spin);
      const auto t0 = Clock::now();
      auto e = d.CreateEvent();
      if (!e.ok() || !d.CopyAsync(row_ops, **stream).ok() ||
          (with_crc && !d.Crc32cAsync(row_crcs, crc_out, **stream).ok()) ||
          !d.Record(**e, **stream).ok()) {
        std::fprintf(stderr, "platform/%s: enqueue failed\n", mode);
        return 3;
      }
      const auto t1 = Clock::now();
      if (!d.Wait(**e).ok()) return 3;
      const auto t2 = Clock::now();
      wall.push_back(Us(t2 - t0));
      enq.push_back(Us(t1 - t0));
      wait.push_back(Us(t2 - t1));
    }
    const std::string row = "platform/" + row_mode + (ipc_pages ? " ipc" : "");
    if (ipc_pages) {
      CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<uint8_t> back(slot_bytes);
      for (uint64_t s = 0; s < total_slots; ++s) {
        const uint8_t* want_s = to_host ? want.data() + s * slot_bytes : slot_src(s);
        const uint8_t* got = back.data();
        if (to_host) {
          got = slot_src(s);
        } else {
          CHECK_CUDA(cudaMemcpy(back.data(), reinterpret_cast<void*>(ipc_page(s)), slot_bytes,
                                cudaMemcpyDeviceToHost));
        }
        if (std::memcmp(got, want_s, slot_bytes) != 0) {
          std::fprintf(stderr, "copy_latency_bench: %s: WRONG BYTES in slot %llu\n", row.c_str(),
                       static_cast<unsigned long long>(s));
          return 1;
        }
      }
      if (to_host) zero_slots();
      for (const auto& m : maps) {
        if (!d.CloseIpc(m.base).ok()) return 3;
      }
    } else {
      verify(row.c_str());
    }
    const Quant w = Q(wall), a = Q(enq), b = Q(wait);
    std::printf("  %-18s %10.1f %10.1f %14.1f %14.1f %10.1f\n", row.c_str(), w.p50, w.p99, a.p50,
                b.p50, double(total_slots * slot_bytes) / (w.p50 * 1e3));
  }
  if (to_host && threads > 0) {
    // Concurrent publishers: does the D2H job slow down when several
    // threads' streams hold D2H work, and does one shared stream avoid it?
    ::setenv(orbitkv::gpu::kGpuCopyEnv, threads_mover.c_str(), 1);
    auto platform = orbitkv::gpu::CreateCudaPlatform();
    ::unsetenv(orbitkv::gpu::kGpuCopyEnv);
    if (!platform.ok()) return 3;
    auto device = (*platform)->device(0);
    if (!device.ok()) return 3;
    orbitkv::gpu::Device& d = **device;
    std::vector<orbitkv::gpu::IpcMapping> maps;
    std::vector<CopyOp> c_ops = ops;
    std::vector<orbitkv::gpu::CrcOp> c_crcs = crc_ops;
    if (ipc_pages && !map_ipc_pages(d, &maps, &c_ops, &c_crcs)) return 3;
    if (objects % threads != 0) {
      std::fprintf(stderr, "copy_latency_bench: --objects must be a multiple of --threads\n");
      return 2;
    }
    const uint64_t per = objects / threads * slots;  // each thread's ops (local pages)
    const int n = threads;
    for (const bool shared : {false, true}) {
      std::unique_ptr<orbitkv::gpu::Stream> one;
      if (shared) {
        auto s1 = d.CreateStream();
        if (!s1.ok()) return 3;
        one = std::move(*s1);
      }
      std::mutex enqueue_mu;
      std::atomic<int> ready{0};
      std::atomic<bool> go{false}, failed{false};
      std::vector<std::vector<double>> enq(n);
      auto body = [&](int t) {
        std::span<const CopyOp> my_ops(c_ops.data() + t * per, per);
        std::span<const orbitkv::gpu::CrcOp> my_crcs(c_crcs.data() + t * per, per);
        uint32_t* my_out = crc_out + t * per;
        std::vector<std::unique_ptr<orbitkv::gpu::Stream>> own;
        for (int k = 0; k < depth && !shared; ++k) {
          auto sk = d.CreateStream();
          if (!sk.ok()) return failed.store(true);
          own.push_back(std::move(*sk));
        }
        std::deque<std::unique_ptr<orbitkv::gpu::Event>> flying;
        ready.fetch_add(1);
        while (!go.load()) {
        }
        for (int i = 0; i < iters && !failed.load(); ++i) {
          if (static_cast<int>(flying.size()) == depth) {
            if (!d.Wait(*flying.front()).ok()) return failed.store(true);
            flying.pop_front();
          }
          const auto t0 = Clock::now();
          auto e = d.CreateEvent();
          if (!e.ok()) return failed.store(true);
          orbitkv::gpu::Stream& s = shared ? *one : *own[i % depth];
          std::unique_lock<std::mutex> l(enqueue_mu, std::defer_lock);
          if (shared) l.lock();
          if (!d.CopyAsync(my_ops, s).ok() || !d.Crc32cAsync(my_crcs, my_out, s).ok() ||
              !d.Record(**e, s).ok()) {
            return failed.store(true);
          }
          if (shared) l.unlock();
          enq[t].push_back(Us(Clock::now() - t0));
          flying.push_back(std::move(*e));
        }
        for (auto& e : flying) {
          if (!d.Wait(*e).ok()) failed.store(true);
        }
      };
      std::vector<std::thread> pool;
      for (int t = 0; t < n; ++t) pool.emplace_back(body, t);
      while (ready.load() < n) {
      }
      const auto t0 = Clock::now();
      go.store(true);
      for (auto& th : pool) th.join();
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (failed.load()) {
        std::fprintf(stderr, "concurrent publish: a CUDA call failed\n");
        return 3;
      }
      std::vector<double> all;
      for (auto& v : enq) all.insert(all.end(), v.begin(), v.end());
      const std::string row = std::to_string(n) + "x" + std::to_string(depth) +
                              (shared ? " one stream" : " own streams") + (ipc_pages ? " ipc" : "");
      verify(row.c_str());
      std::printf("  %-18s %10s %10s %14.1f %14s %10.1f   (aggregate, %.2f MiB jobs)\n",
                  row.c_str(), "-", "-", Q(all).p50, "-",
                  double(n) * iters * per * slot_bytes / (secs * 1e9),
                  double(per * slot_bytes) / (1 << 20));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    for (const auto& m : maps) {
      if (!d.CloseIpc(m.base).ok()) return 3;
    }
  }
  if (crc_out) CHECK_CUDA(cudaFreeHost(crc_out));
  if (child > 0) {
    ::close(release_fd);
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  return 0;
}
