// Helpers shared by the SSD store tests: aligned buffers and a store on a
// temporary directory with its own registry and fault injector.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "io/io_engine.h"
#include "orbitkv/metrics.h"
#include "store/ssd_store.h"
#include "testing/temp_dir.h"

namespace orbitkv::testing {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<uint8_t[], AlignedFree>;

inline AlignedBuf AllocAligned(size_t n) {
  size_t len = (n + 4095) / 4096 * 4096;
  if (len == 0) len = 4096;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, len));
  std::memset(p, 0xEE, len);  // poison: a missed write shows up
  return AlignedBuf(p);
}

// Deterministic bytes for (seed, size): what a test wrote, recomputable later.
inline std::vector<uint8_t> Pattern(uint64_t seed, size_t size) {
  std::vector<uint8_t> out(size);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 1);
  for (size_t i = 0; i < size; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, size - i));
  }
  return out;
}

struct StoreFixture {
  TempDir dir;
  MetricsRegistry metrics;
  ScriptedIoFaults faults;
  ManualClock clock;
  std::unique_ptr<SsdStore> store;
  std::unique_ptr<IoEngine> io;

  Status Open(uint32_t shards, uint64_t capacity, uint32_t queue_depth = 16,
              uint64_t max_read = 4u << 20, uint64_t chunk = 1u << 20) {
    SsdStoreOptions o;
    o.path = dir.File("cache.bin");
    o.capacity = capacity;
    o.shards = shards;
    o.metrics = &metrics;
    o.clock = &clock;
    o.max_read_bytes = max_read;
    o.write_chunk_bytes = chunk;
    ORBITKV_ASSIGN_OR_RETURN(store, SsdStore::Open(o));
    ORBITKV_ASSIGN_OR_RETURN(io, CreateUringEngine({queue_depth, &faults}));
    return Status::OK();
  }

  Result<ExtentRef> Write(const Key& key, const std::vector<uint8_t>& bytes) {
    AlignedBuf buf = AllocAligned(bytes.size());
    std::memcpy(buf.get(), bytes.data(), bytes.size());
    return store->WriteObject(*io, key, buf.get(), bytes.size());
  }

  // Leases, reads and releases one ref; returns the object bytes.
  Result<std::vector<uint8_t>> Read(const ExtentRef& ref) {
    ORBITKV_ASSIGN_OR_RETURN(LeaseId lease, store->catalog().AcquireLease({&ref, 1}, {}));
    ORBITKV_RETURN_IF_ERROR(store->catalog().Submit(lease));
    AlignedBuf buf = AllocAligned(ref.length);
    ExtentRead r{ref, buf.get(), {}};
    Status st = store->ReadExtents(*io, {&r, 1});
    store->catalog().Complete(lease);
    ORBITKV_RETURN_IF_ERROR(st);
    return std::vector<uint8_t>(buf.get(), buf.get() + ref.object_size);
  }

  double Metric(std::string_view name, const Labels& labels = {}) {
    return metrics.Read(name, labels);
  }
};

}  // namespace orbitkv::testing
