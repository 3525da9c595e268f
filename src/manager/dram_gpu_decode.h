// DramGpuDecode: restores encoded DRAM entries into CUDA pages on the GPU
// (README "In the Manager", "DRAM restores of encoded entries"). The encoded
// object crosses PCIe as it is stored: its bytes are copied H2D from the
// pinned pool (registered with CUDA) into a range of a GPU decode lane's
// arena (gpu_decode_lane.h), CRC32C- and prefix-checked there on the GPU
// against the header's segment CRCs before any frame is decoded, then decoded
// straight into the engine pages (FrameDecoder: CudaDecoder on CUDA, the CPU
// codec on the fake platform). A call's blocks go to the lane in batches of
// up to kDecodeBatchBytes of encoded bytes, so one batch's H2D copy overlaps
// the previous one's decode. Corruption is a per-block error
// with the pages untouched, counted as on the other routes.
//
// One lane per CUDA device, made when the first such instance registers and kept while
// CUDA instances of encoded namespaces of the device are registered (Attach /
// Detach): it holds GpuCodecShare of --codec-budget (arena + decoder
// scratch), given back with the device's last such instance. Where no lane can be made (the budget
// is held, the platform has no decoder), or a block does not fit it (an object larger than the
// arena, a slot whose page is not the whole slot or not 16-byte aligned), the block is declined:
// the caller decodes it on the CPU, counted on orbitkv_codec_dram_restores_total{where="cpu"}.
//
// Thread-safe: Restore from any number of threads (the lanes are shared).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "gpu/platform.h"
#include "manager/gpu_decode_lane.h"
#include "manager/instance.h"
#include "manager/storage_codec.h"
#include "store/object_id.h"

namespace orbitkv {

class DramGpuDecode {
 public:
  struct Options {
    CodecBudget* budget = nullptr;          // required
    uint64_t share_bytes = 0;               // each lane's arena + scratch; 0: no GPU decode
    const CodecMetrics* metrics = nullptr;  // required
    Histogram* cost_enqueue = nullptr;      // GpuDecodeLaneOptions' (null: not observed)
    Histogram* cost_wait = nullptr;
  };
  explicit DramGpuDecode(Options options) : o_(options) {}
  ~DramGpuDecode();  // closes the lanes (no Restore may be running)
  DramGpuDecode(const DramGpuDecode&) = delete;
  DramGpuDecode& operator=(const DramGpuDecode&) = delete;

  // A CUDA instance of an encoded namespace on `device` registered / left.
  // The last Detach of a device frees its lane. REQUIRES: Detach after the
  // instance's last Restore returned, once per Attach.
  void Attach(gpu::Device& device) EXCLUDES(mu_);
  void Detach(gpu::Device& device) EXCLUDES(mu_);

  // One encoded DRAM entry (its pinned bytes) to restore.
  using Block = PageObject;
  // Decodes `blocks` of `inst` (a CUDA instance of an encoded namespace) into
  // its pages and waits for them. Per block: nullopt when declined (decode it
  // on the CPU; counted), else its result. REQUIRES: the caller holds the
  // instance and the entries' pins until this returns.
  std::vector<std::optional<Status>> Restore(const Instance& inst, std::span<const Block> blocks)
      EXCLUDES(mu_);

 private:
  struct Lane {
    size_t users = 0;    // Attach - Detach (under DramGpuDecode::mu_)
    bool tried = false;  // a lane was asked for (under DramGpuDecode::mu_)
    Mutex mu;
    CondVar space;  // a range went back to the arena
    uint64_t gen GUARDED_BY(mu) = 0;
    // Last: its thread (on_space uses the above) stops before they go.
    std::unique_ptr<GpuDecodeLane> lane;  // null: none (yet, or it could not be made)
  };
  // The device's lane (made on first use); null when it cannot be made.
  // REQUIRES: the device is attached.
  Lane* LaneFor(gpu::Device& device) EXCLUDES(mu_);

  const Options o_;
  Mutex mu_;
  std::map<gpu::Device*, std::unique_ptr<Lane>> lanes_ GUARDED_BY(mu_);
};

}  // namespace orbitkv
