#include "bench/page_target.h"

#include <cstdlib>
#include <cstring>

#include "bench/cuda_pages.h"
#include "orbitkv/device.h"
#include "orbitkv/units.h"
#include "workload/pages.h"
#include "workload/workload.h"

namespace orbitkv::bench {
namespace {

// Host pages: sealed memfds (demo::Pages), one region per slot.
class HostPageTarget final : public PageTarget {
 public:
  HostPageTarget(InstanceLayout layout, demo::Pages pages)
      : layout_(std::move(layout)), pages_(std::move(pages)) {}

  const InstanceLayout& layout() const override { return layout_; }
  void Describe(RegisterRequest* request, std::vector<int>* region_fds) const override {
    request->device = "host";
    request->layout = layout_;
    region_fds->assign(pages_.fds().begin(), pages_.fds().end());
  }
  void Poison(uint64_t page) override { pages_.Poison(page); }
  void Fill(const BlockKey& key, uint64_t page) override {
    for (uint32_t s = 0; s < pages_.slots(); ++s)
      demo::FillBlockSlot(key, s, pages_.Slot(s, page), pages_.slot_bytes(s));
  }
  bool Check(const BlockKey& key, uint64_t page) override {
    for (uint32_t s = 0; s < pages_.slots(); ++s)
      if (!demo::CheckBlockSlot(key, s, pages_.Slot(s, page), pages_.slot_bytes(s))) return false;
    return true;
  }
  void Gather(uint64_t page, uint8_t* dst) override {
    for (uint32_t s = 0; s < pages_.slots(); ++s) {
      std::memcpy(dst, pages_.Slot(s, page), pages_.slot_bytes(s));
      dst += pages_.slot_bytes(s);
    }
  }
  void Scatter(const uint8_t* src, uint64_t page) override {
    for (uint32_t s = 0; s < pages_.slots(); ++s) {
      std::memcpy(pages_.Slot(s, page), src, pages_.slot_bytes(s));
      src += pages_.slot_bytes(s);
    }
  }

 private:
  InstanceLayout layout_;
  demo::Pages pages_;
};

}  // namespace

Result<uint8_t*> PageTarget::AllocateBuffer(uint64_t bytes) {
  void* buf = nullptr;
  if (::posix_memalign(&buf, 4096, AlignUp(bytes, 4096)) != 0)
    return Status::ResourceExhausted("no memory for a " + std::to_string(bytes) + "-byte buffer");
  return static_cast<uint8_t*>(buf);
}

void PageTarget::FreeBuffer(uint8_t* buffer) { std::free(buffer); }

uint64_t PageTarget::block_bytes() const {
  uint64_t sum = 0;
  for (uint64_t b : layout().groups.at(0).slot_bytes) sum += b;
  return sum;
}

Result<std::unique_ptr<PageTarget>> CreatePageTarget(const std::string& device, uint64_t pages,
                                                     const std::vector<uint64_t>& slot_bytes,
                                                     bool page_first) {
  ORBITKV_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDevice(device, "--device"));
  if (spec.cuda) return CreateCudaPageTarget(device, pages, slot_bytes, page_first);
  InstanceLayout layout =
      page_first ? PageFirstLayout(pages, slot_bytes) : SplitLayout(pages, slot_bytes);
  ORBITKV_ASSIGN_OR_RETURN(demo::Pages p, demo::Pages::Create(layout));
  return std::unique_ptr<PageTarget>(new HostPageTarget(std::move(layout), std::move(p)));
}

}  // namespace orbitkv::bench
