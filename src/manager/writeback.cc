#include "manager/writeback.h"

#include <algorithm>

#include "orbitkv/logging.h"
#include "orbitkv/units.h"

namespace orbitkv {

Writeback::Writeback(Options options) : o_(std::move(options)) {
  queue_ = std::make_unique<WorkQueue<Item>>(
      "okv-writeback", o_.queue, o_.engines.size(),
      [this](size_t w, std::vector<Item>& items) { Lane(w, items); },
      std::max<size_t>(1, o_.batch));
}

void Writeback::Queue(const ObjectId& id, const NamespaceCodec& codec) {
  Item item{id, codec, o_.lanes->Start()};
  if (!queue_->TryPush(item)) {
    o_.queue_full->Inc();
    if (auto w = o_.dram->TakeWriteback(id)) o_.dram->FinishWriteback(*w, false);
  }  // else the lane owns item.token now; a refused item's token ends here
}

Result<DramView> Writeback::WaitForRoom(Result<DramView> v,
                                        std::chrono::steady_clock::time_point deadline,
                                        const std::function<Result<DramView>()>& attempt) {
  room_waiters_.fetch_add(1);  // the lanes stop yielding to restores
  {
    MutexLock l(room_mu_);
    while (!v.ok() && v.status().code() == StatusCode::kResourceExhausted &&
           o_.dram->stats().writeback_pending > 0) {
      if (!room_.WaitUntil(room_mu_, deadline)) break;
      v = attempt();
    }
  }
  room_waiters_.fetch_sub(1);
  return v;
}

void Writeback::Lane(size_t worker, std::vector<Item>& items) {
  std::vector<DramView> views;
  std::vector<SsdStore::ObjectWrite> writes;
  std::vector<const NamespaceCodec*> codecs;  // per write: the encoded one's codec, else null
  std::vector<CodecBuffer> encoded;           // live until their objects are written
  uint64_t held = 0;                          // bytes of `encoded`
  const uint64_t budget = std::max<uint64_t>(1, o_.codec_budget / o_.engines.size());
  auto flush = [&] {
    Write(*o_.engines[worker], writes);
    for (size_t i = 0; i < views.size(); ++i) {
      if (writes[i].result.ok()) o_.bytes->Inc(writes[i].size);
      if (writes[i].result.ok() && codecs[i] && o_.encoded_dram_copies) {
        KeepEncodedCopy(views[i], writes[i], *codecs[i]);
      }
      o_.dram->FinishWriteback(views[i], writes[i].result.ok());
    }
    views.clear();
    writes.clear();
    codecs.clear();
    encoded.clear();
    held = 0;
  };
  for (const Item& item : items) {
    std::optional<DramView> v = o_.dram->TakeWriteback(item.id);
    if (!v) continue;
    if (item.codec.raw()) {
      views.push_back(*v);
      writes.push_back({StoreKey(item.id), v->data, v->size, item.id.ns});
      codecs.push_back(nullptr);
      continue;
    }
    CodecBuffer buf;
    Result<uint64_t> n = EncodeObject(item.codec, {v->data, v->size}, &buf, *o_.codec_metrics);
    if (!n.ok()) {  // counted on orbitkv_codec_failures_total
      OKV_LOG_WARN("writeback of {}: not stored on SSD: {}", item.id.key.ShortHex(),
                   n.status().ToString());
      o_.dram->FinishWriteback(*v, false);
      continue;
    }
    views.push_back(*v);
    writes.push_back({StoreKey(item.id), buf.data(), *n, item.id.ns});
    codecs.push_back(&item.codec);
    held += buf.capacity();
    encoded.push_back(std::move(buf));
    // The lane's share of --codec-budget bounds the encoded bytes it holds:
    // past it, what is encoded is written before the next object is.
    if (held >= budget) flush();
  }
  flush();
  {
    MutexLock l(room_mu_);  // pairs with the publisher's wait
  }
  room_.NotifyAll();  // room may have been freed for waiting publishers
  for (Item& item : items) item.token.Release();
}

// How often a yielding lane looks for publishers waiting for room.
static constexpr auto kYieldSlice = std::chrono::milliseconds(2);

void Writeback::Write(IoEngine& io, std::span<SsdStore::ObjectWrite> writes) {
  const bool yields = o_.restore_reads != nullptr && o_.yield.count() > 0;
  auto yielding = [&] {
    return yields && room_waiters_.load() == 0 && o_.restore_reads->outstanding() > 0;
  };
  while (!writes.empty()) {
    size_t n = writes.size();
    if (yielding()) {
      // In slices, so that a publisher starting to wait for room ends the wait.
      const auto start = std::chrono::steady_clock::now();
      const auto deadline = start + o_.yield;
      for (auto now = start; now < deadline && yielding(); now = std::chrono::steady_clock::now()) {
        o_.restore_reads->DrainUntil(std::min(deadline, now + kYieldSlice));
      }
      o_.yield_seconds->Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      // Reads still outstanding (or come since): one object, then look again.
      if (yielding()) n = 1;
    }
    o_.ssd->WriteObjects(io, writes.first(n));
    writes = writes.subspan(n);
  }
}

void Writeback::KeepEncodedCopy(const DramView& raw, const SsdStore::ObjectWrite& write,
                                const NamespaceCodec& codec) {
  // Only where it saves pool pages: an object the codec did not shrink (ans
  // on random bytes stores its frames) stays raw.
  if (AlignUp(write.size, 4096) >= AlignUp(raw.size, 4096)) return;
  Status st = o_.dram->ReplaceSealed(raw, {static_cast<const uint8_t*>(write.data), write.size});
  if (st.ok()) {
    const CodecMetrics::Series& s = o_.codec_metrics->of(codec.id);
    s.dram_copies->Inc();
    s.dram_bytes_saved->Inc(AlignUp(raw.size, 4096) - AlignUp(write.size, 4096));
  } else if (st.code() != StatusCode::kFailedPrecondition) {
    // No free pool range for it now: the raw copy stays (exact, only larger).
    OKV_LOG_DEBUG("writeback: raw DRAM copy kept: {}", st.ToString());
  }
}

}  // namespace orbitkv
