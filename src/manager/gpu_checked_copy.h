// GpuCheckedCopy: raw objects in pinned host memory (the io_uring route's
// read staging) into CUDA pages, with their payload CRC32C computed by the GPU
// instead of the CPU (issue 18: the CPU CRC was half of the ssd-uring route's
// Manager CPU per GB). Per call, in order:
//   1. each object's header is parsed and matched to its id and shape on the
//      CPU (a few hundred bytes; no payload read);
//   2. each object goes H2D, whole, into device staging (one DMA each), and
//      the GPU computes the CRC32C of every segment there (all of them, not
//      only the slots this instance holds: a damaged object is dropped, as on
//      the CPU path) into pinned results; one event, one wait;
//   3. the host compares them with the headers (CheckSegmentCrc: the CPU
//      path's error), and only the objects that match are scattered D2D from
//      the staging into the engine's pages (one gather-scatter launch), then
//      waited for.
// So a damaged object leaves its pages untouched, as on the CPU path, and the
// CPU never reads a payload byte.
//
// Staging: per device, `buffers` buffers of `buffer_bytes` device memory and
// a pinned result array each, outside --pool-size (on the staging gauge),
// allocated when first needed and kept until this goes (one that cannot be
// made, device memory being full, is logged and not tried again). A call takes one
// buffer, or declines every block when none is free or it cannot be made;
// blocks that do not fit the buffer are done in several rounds. An object
// larger than a buffer (a hybrid model's recurrent-state checkpoint of tens of
// MiB) is checked in place, in a round like the others: the GPU computes its
// segments' CRC32C reading the pinned host copy itself
// (Device::KernelsReadHost), and only when all match are its slots copied H2D
// into the pages; where the device cannot read that memory, or the round's
// CRC job fails (nothing written yet), it is declined. An
// encoded object is declined (the caller checks and decodes it on the CPU;
// declined blocks are counted on `declined`).
//
// Thread-safe: Restore from any number of threads. REQUIRES: destroyed
// before the platform of its devices, after the last Restore returned.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "gpu/platform.h"
#include "manager/instance.h"
#include "orbitkv/metrics.h"
#include "store/object_format.h"
#include "store/object_id.h"

namespace orbitkv {

class GpuCheckedCopy {
 public:
  struct Options {
    uint64_t buffer_bytes = 16u << 20;  // one buffer; 0: never taken (every block declined)
    uint32_t buffers = 2;               // per device
    Gauge* staging_bytes = nullptr;     // device staging held (required)
    Counter* checked_bytes = nullptr;   // object bytes CRC-checked on the GPU (required)
    Counter* declined = nullptr;        // blocks left to the CPU path (required)
  };
  explicit GpuCheckedCopy(Options options) : o_(options) {}
  ~GpuCheckedCopy();
  GpuCheckedCopy(const GpuCheckedCopy&) = delete;
  GpuCheckedCopy& operator=(const GpuCheckedCopy&) = delete;

  // One object read from SSD (pinned host bytes, registered with CUDA).
  using Block = PageObject;
  // Restores `blocks` into the pages of `inst` (a CUDA instance) and waits
  // for them. Per block: nullopt when declined (check it on the CPU), else
  // its result (Corruption for a damaged object; its pages untouched).
  // REQUIRES: the caller holds the instance and the objects' bytes until this
  // returns.
  std::vector<std::optional<Status>> Restore(const Instance& inst, std::span<const Block> blocks)
      EXCLUDES(mu_);

 private:
  struct Buffer {
    gpu::Device* device = nullptr;
    gpu::DevPtr data = 0;
    uint32_t* crcs = nullptr;  // pinned, buffer_bytes / 512 entries
    std::unique_ptr<gpu::Stream> stream;
    std::unique_ptr<gpu::Event> event;
  };
  // A free buffer of `device` (made when fewer than `buffers` exist); null
  // when none is free or one cannot be made.
  Buffer* Take(gpu::Device& device) EXCLUDES(mu_);
  void Give(Buffer* b) EXCLUDES(mu_);
  void Destroy(Buffer& b);
  // A block of a round: blocks[block], its header, and where the GPU reads
  // it: its place in the staging, or (in_place) its pinned host copy.
  struct Item {
    size_t block = 0;
    gpu::DevPtr src = 0;
    bool in_place = false;
    ParsedHeader header;
  };
  // One round: every item fits the buffer together (staged bytes and CRC
  // results). Items read in place are left unset (declined) when the round's
  // copy or CRC job fails; nothing of them was written.
  void Round(const Instance& inst, Buffer& buf, std::span<const Block> blocks,
             std::span<const Item> round, std::vector<std::optional<Status>>& out);

  const Options o_;
  Mutex mu_;
  std::map<gpu::Device*, std::vector<std::unique_ptr<Buffer>>> made_ GUARDED_BY(mu_);
  std::map<gpu::Device*, std::vector<Buffer*>> free_ GUARDED_BY(mu_);
  std::set<gpu::Device*> refused_ GUARDED_BY(mu_);  // a buffer could not be made: none again
};

}  // namespace orbitkv
