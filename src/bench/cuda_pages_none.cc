// The CUDA-page hooks of a build without the GPU tier's implementation.
#include "bench/cuda_pages.h"

namespace orbitkv::bench {
namespace {

Status NotBuilt(const std::string& device) {
  return Status::Unavailable(
      "--device " + device +
      ": this orbitkv-bench has no CUDA pages (built without the GPU storage tier's CUDA "
      "page target); use --device host");
}

}  // namespace

bool CudaPagesBuilt() { return false; }

Status CheckCudaPagesDevice(const std::string& device) { return NotBuilt(device); }

Result<std::unique_ptr<PageTarget>> CreateCudaPageTarget(const std::string& device,
                                                         const InstanceLayout&) {
  return NotBuilt(device);
}

Result<CudaCopyCeilings> MeasureCudaCopyCeilings(const std::string& device, uint64_t, double) {
  return NotBuilt(device);
}

}  // namespace orbitkv::bench
