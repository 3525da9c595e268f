#include "manager/writeback.h"

#include <algorithm>

namespace orbitkv {

Writeback::Writeback(Options options) : o_(std::move(options)) {
  queue_ = std::make_unique<WorkQueue<Item>>(
      o_.queue, o_.engines.size(), [this](size_t w, std::vector<Item>& items) { Lane(w, items); },
      std::max<size_t>(1, o_.batch));
}

void Writeback::Queue(const ObjectId& id) {
  Item item{id, o_.lanes->Start()};
  if (!queue_->TryPush(item)) {
    o_.queue_full->Inc();
    if (auto w = o_.dram->TakeWriteback(id)) o_.dram->FinishWriteback(*w, false);
  }  // else the lane owns item.token now; a refused item's token ends here
}

Result<DramView> Writeback::WaitForRoom(Result<DramView> v,
                                        std::chrono::steady_clock::time_point deadline,
                                        const std::function<Result<DramView>()>& attempt) {
  MutexLock l(room_mu_);
  while (!v.ok() && v.status().code() == StatusCode::kResourceExhausted &&
         o_.dram->stats().writeback_pending > 0) {
    if (!room_.WaitUntil(room_mu_, deadline)) break;
    v = attempt();
  }
  return v;
}

void Writeback::Lane(size_t worker, std::vector<Item>& items) {
  std::vector<DramView> views;
  std::vector<SsdStore::ObjectWrite> writes;
  for (const Item& item : items) {
    if (std::optional<DramView> v = o_.dram->TakeWriteback(item.id)) {
      views.push_back(*v);
      writes.push_back({StoreKey(item.id), v->data, v->size, item.id.ns});
    }
  }
  o_.ssd->WriteObjects(*o_.engines[worker], writes);
  for (size_t i = 0; i < views.size(); ++i) {
    if (writes[i].result.ok()) o_.bytes->Inc(views[i].size);
    o_.dram->FinishWriteback(views[i], writes[i].result.ok());
  }
  {
    MutexLock l(room_mu_);  // pairs with the publisher's wait
  }
  room_.NotifyAll();  // room may have been freed for waiting publishers
  for (Item& item : items) item.token.Release();
}

}  // namespace orbitkv
