#include "bench/backend.h"

#include <cstdlib>

#include "orbitkv/client.h"

namespace orbitkv::bench {
namespace {

class ManagerBackend final : public Backend {
 public:
  ManagerBackend(std::unique_ptr<Client> client, InstanceId instance)
      : client_(std::move(client)), instance_(instance) {}

  Result<Lookup> Query(std::span<const BlockKey> keys) override {
    QueryRequest q;
    q.instance = instance_;
    q.keys.assign(keys.begin(), keys.end());
    ORBITKV_ASSIGN_OR_RETURN(QueryResult r, client_->Query(q));
    return Lookup{
        r.query,           r.prefix, std::move(r.sources), r.prefix_tokens, std::move(r.pieces),
        r.not_needed_bytes};
  }

  Result<std::vector<BlockResult>> Restore(const Lookup& lookup, std::span<const BlockKey>,
                                           std::span<const uint32_t> blocks,
                                           std::span<const uint64_t> pages) override {
    RestoreRequest r;
    r.instance = instance_;
    r.query = lookup.query;
    r.blocks.assign(blocks.begin(), blocks.end());
    r.pages.assign(pages.begin(), pages.end());
    r.want_timeline = true;
    last_timeline_.reset();
    ORBITKV_ASSIGN_OR_RETURN(RestoreResult res, client_->Restore(r, client_->NewTicket()));
    last_timeline_ = res.timeline;
    return std::move(res.blocks);
  }

  std::optional<RestoreTimeline> last_timeline() const override { return last_timeline_; }

  Status Release(const Lookup& lookup) override {
    if (lookup.query == 0) return Status::OK();
    return client_->ReleaseQuery(instance_, lookup.query);
  }

  Result<PublishResult> Publish(uint32_t group_id, std::span<const BlockKey> keys,
                                std::span<const uint64_t> pages) override {
    PublishRequest p;
    p.instance = instance_;
    p.group_id = group_id;
    p.keys.assign(keys.begin(), keys.end());
    p.pages.assign(pages.begin(), pages.end());
    return client_->Publish(p);
  }

  Status Close() override {
    Status st = client_->UnregisterInstance(instance_);
    client_->Close();
    return st;
  }

 private:
  std::unique_ptr<Client> client_;
  InstanceId instance_;
  std::optional<RestoreTimeline> last_timeline_;
};

class NaiveBackend final : public Backend {
 public:
  NaiveBackend(NaiveStore& store, PageTarget& pages, uint8_t* buffer)
      : store_(store), pages_(pages), buffer_(buffer) {}
  ~NaiveBackend() override { pages_.FreeBuffer(buffer_); }

  Result<Lookup> Query(std::span<const BlockKey> keys) override {
    Lookup l;
    l.prefix = store_.Prefix(keys);
    l.tiers.assign(l.prefix, Tier::kSsd);
    return l;
  }

  Result<std::vector<BlockResult>> Restore(const Lookup&, std::span<const BlockKey> keys,
                                           std::span<const uint32_t> blocks,
                                           std::span<const uint64_t> pages) override {
    std::vector<BlockResult> out;
    for (size_t i = 0; i < blocks.size(); ++i) {
      BlockResult b;
      b.block = blocks[i];
      b.source = Tier::kSsd;
      b.status = store_.Read(keys[blocks[i]], buffer_);
      if (b.status.ok()) pages_.Scatter(0, buffer_, pages[i]);
      out.push_back(std::move(b));
    }
    return out;
  }

  Status Release(const Lookup&) override { return Status::OK(); }

  Result<PublishResult> Publish(uint32_t group_id, std::span<const BlockKey> keys,
                                std::span<const uint64_t> pages) override {
    if (group_id != 0)
      return Status::InvalidArgument("the naive store keeps one group; group " +
                                     std::to_string(group_id) + " asked");
    PublishResult r;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (store_.Contains(keys[i])) {
        ++r.skipped;
        continue;
      }
      pages_.Gather(0, pages[i], buffer_);
      Status st = store_.Write(keys[i], buffer_);
      if (st.ok()) {
        ++r.stored;
        ++r.sealed;
      } else if (st.code() == StatusCode::kAlreadyExists) {
        ++r.skipped;
      } else if (st.code() == StatusCode::kResourceExhausted) {
        ++r.dropped;
      } else {
        return st;
      }
    }
    return r;
  }

  Status Close() override { return Status::OK(); }

 private:
  NaiveStore& store_;
  PageTarget& pages_;
  uint8_t* buffer_;  // one block, 4 KiB aligned (pinned for CUDA pages), owned
};

}  // namespace

Result<std::unique_ptr<Backend>> ConnectManagerBackend(
    const std::string& socket, const std::string& ns, PageTarget& pages,
    const std::string& client_name, const StorageCodecRequest& storage,
    const std::optional<ModelDescription>& model) {
  ClientConfig cc;
  cc.socket_path = socket;
  cc.client_name = client_name;
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(cc));
  RegisterRequest reg;
  reg.ns = ns;
  reg.storage = storage;
  reg.model = model;
  std::vector<int> fds;
  pages.Describe(&reg, &fds);
  ORBITKV_ASSIGN_OR_RETURN(InstanceId instance, client->RegisterInstance(reg, fds));
  return std::unique_ptr<Backend>(new ManagerBackend(std::move(client), instance));
}

Result<std::unique_ptr<Backend>> NewNaiveBackend(NaiveStore& store, PageTarget& pages) {
  Result<uint8_t*> buf = pages.AllocateBuffer(store.slot_bytes());
  if (!buf.ok()) return buf.status().WithContext("the naive route's host buffer");
  return std::unique_ptr<Backend>(new NaiveBackend(store, pages, *buf));
}

}  // namespace orbitkv::bench
