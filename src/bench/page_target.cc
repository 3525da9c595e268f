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

// Host pages: sealed memfds (demo::Pages), any layout.
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
  void Poison(uint32_t group, uint64_t page) override { pages_.Poison(group, page); }
  void Fill(uint32_t group, const BlockKey& key, uint64_t page) override {
    pages_.Fill(group, key, page);
  }
  bool Check(uint32_t group, const BlockKey& key, uint64_t page) override {
    return pages_.Check(group, key, page);
  }
  void Gather(uint32_t group, uint64_t page, uint8_t* dst) override {
    for (uint32_t s = 0; s < pages_.slots(group); ++s) {
      std::memcpy(dst, pages_.Slot(group, s, page), pages_.slot_bytes(group, s));
      dst += pages_.slot_bytes(group, s);
    }
  }
  void Scatter(uint32_t group, const uint8_t* src, uint64_t page) override {
    for (uint32_t s = 0; s < pages_.slots(group); ++s) {
      std::memcpy(pages_.Slot(group, s, page), src, pages_.slot_bytes(group, s));
      src += pages_.slot_bytes(group, s);
    }
  }

 private:
  InstanceLayout layout_;
  demo::Pages pages_;
};

}  // namespace

void PageTarget::FillMany(uint32_t group, std::span<const BlockKey> keys,
                          std::span<const uint64_t> pages) {
  for (size_t i = 0; i < keys.size(); ++i) Fill(group, keys[i], pages[i]);
}

void PageTarget::PoisonMany(std::span<const PageRef> pages) {
  for (const PageRef& p : pages) Poison(p.group, p.page);
}

std::vector<bool> PageTarget::CheckMany(std::span<const PageRef> pages,
                                        std::span<const BlockKey> keys) {
  std::vector<bool> right(pages.size());
  for (size_t i = 0; i < pages.size(); ++i)
    right[i] = Check(pages[i].group, keys[i], pages[i].page);
  return right;
}

Result<uint8_t*> PageTarget::AllocateBuffer(uint64_t bytes) {
  void* buf = nullptr;
  if (::posix_memalign(&buf, 4096, AlignUp(bytes, 4096)) != 0)
    return Status::ResourceExhausted("no memory for a " + std::to_string(bytes) + "-byte buffer");
  return static_cast<uint8_t*>(buf);
}

void PageTarget::FreeBuffer(uint8_t* buffer) { std::free(buffer); }

uint64_t PageTarget::group_bytes(uint32_t group) const {
  uint64_t sum = 0;
  for (const SlotLayout& s : layout().groups.at(group).slots) sum += s.bytes_per_page;
  return sum;
}

Result<std::unique_ptr<PageTarget>> CreatePageTarget(const std::string& device,
                                                     const InstanceLayout& layout) {
  ORBITKV_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDevice(device, "--device"));
  if (spec.cuda) return CreateCudaPageTarget(device, layout);
  ORBITKV_ASSIGN_OR_RETURN(demo::Pages p, demo::Pages::Create(layout));
  return std::unique_ptr<PageTarget>(new HostPageTarget(layout, std::move(p)));
}

Result<std::unique_ptr<PageTarget>> CreatePageTarget(const std::string& device, uint64_t pages,
                                                     const std::vector<uint64_t>& slot_bytes,
                                                     bool page_first) {
  return CreatePageTarget(
      device, page_first ? PageFirstLayout(pages, slot_bytes) : SplitLayout(pages, slot_bytes));
}

}  // namespace orbitkv::bench
