#include "server/service.h"

#include <unistd.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "orbitkv/logging.h"
#include "protocol/wire.h"

namespace orbitkv {

using protocol::DecodedMessage;

ManagerService::ManagerService(Manager* manager, MetricsRegistry* metrics) : manager_(manager) {
  bad_frames_ = metrics->GetCounter("orbitkv_protocol_bad_frames_total",
                                    "Frames that failed to decode or validate (answered with an "
                                    "error).");
  requests_ = metrics->GetCounter("orbitkv_protocol_requests_total", "Requests received.");
  for (size_t i = 0; i < request_seconds_.size(); ++i) {
    const std::string_view op = protocol::MessageName(i);
    if (op.ends_with("Reply")) continue;  // only requests reach OnFrame
    const Labels labels{{"op", std::string(op)}};
    request_seconds_[i] = metrics->GetHistogram(
        "orbitkv_request_seconds",
        "From the Manager reading a request's last byte to its reply sent (the wait for a "
        "request thread, decode, the call, encode and send; a restore: until started, or "
        "replied when it completed inline).",
        LatencyBuckets(), labels);
    request_wait_seconds_[i] = metrics->GetHistogram(
        "orbitkv_request_wait_seconds",
        "From the Manager reading a request's last byte to a request thread taking it up.",
        LatencyBuckets(), labels);
  }
}

void ManagerService::OnOpen(protocol::Session& session) {
  SessionId id = manager_->OpenSession(session.peer_pid());
  std::lock_guard<std::mutex> l(mu_);
  sessions_[session.id()] = id;
  OKV_LOG_INFO("session {} opened by pid {}", session.id(), session.peer_pid());
}

void ManagerService::OnClose(protocol::Session& session) {
  SessionId id;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = sessions_.find(session.id());
    if (it == sessions_.end()) return;
    id = it->second;
    sessions_.erase(it);
    instances_.erase(session.id());
  }
  manager_->CloseSession(id);
  OKV_LOG_INFO("session {} closed; its instances, queries and leases are released", session.id());
}

bool ManagerService::MayCloseIdle(const protocol::Session& session) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = instances_.find(session.id());
  return it == instances_.end() || it->second == 0;
}

SessionId ManagerService::ManagerSession(const protocol::Session& session) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sessions_.find(session.id());
  return it == sessions_.end() ? 0 : it->second;
}

void ManagerService::OnFrame(protocol::Session& session, protocol::Frame&& frame) {
  requests_->Inc();
  const SessionId sid = ManagerSession(session);
  auto reply = [&](const std::vector<uint8_t>& bytes) {
    session.Send(bytes).IgnoreError("a closed session drops its replies");
  };
  Result<DecodedMessage> decoded = protocol::DecodeMessage(frame.payload);
  if (!decoded.ok()) {
    bad_frames_->Inc();
    reply(protocol::EncodeError(protocol::PeekEnvelopeId(frame.payload).value_or(0),
                                decoded.status()));
    return;
  }
  const uint64_t rid = decoded->id;
  // Observed once the handler below returns, whatever it answered.
  struct Timed {
    Histogram* h;
    int64_t from_ns;
    ~Timed() {
      if (h != nullptr && from_ns > 0)
        h->Observe(static_cast<double>(protocol::SteadyNowNs() - from_ns) * 1e-9);
    }
  } timed{request_seconds_[decoded->body.index()], frame.read_ns};
  if (Histogram* wait = request_wait_seconds_[decoded->body.index()];
      wait != nullptr && frame.read_ns > 0 && frame.dispatched_ns >= frame.read_ns) {
    wait->Observe(static_cast<double>(frame.dispatched_ns - frame.read_ns) * 1e-9);
  }
  // Before any handler runs: a request with the wrong fds (a CUDA register
  // with any, a host register without one per region) is refused here, and
  // the fds close with the frame.
  if (Status st = protocol::CheckAttachedFds(decoded->body, frame.fds.size()); !st.ok()) {
    bad_frames_->Inc();
    reply(protocol::EncodeError(rid, st));
    return;
  }
  auto answer = [&](const auto& result) {  // Result<T> whose T has an EncodeReply
    if (result.ok()) {
      reply(protocol::EncodeReply(rid, *result));
    } else {
      reply(protocol::EncodeError(rid, result.status()));
    }
  };
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, protocol::HelloRequest>) {
          protocol::HelloReply h;
          h.server_pid = ::getpid();
          reply(protocol::EncodeReply(rid, h));
        } else if constexpr (std::is_same_v<T, RegisterRequest>) {
          // DecodeMessage and CheckAttachedFds above have settled how the
          // regions travel: "host" brings one memfd per region and no
          // ipc_handles; "cuda:N" one IPC handle per region (in m.ipc_handles,
          // which the Manager opens itself) and no fds, so `fds` stays empty.
          std::vector<int> fds;
          fds.reserve(frame.fds.size());
          for (auto& fd : frame.fds) fds.push_back(fd.Release());
          Result<InstanceId> id = manager_->RegisterInstance(sid, m, std::move(fds));
          if (id.ok()) {
            {
              std::lock_guard<std::mutex> l(mu_);
              ++instances_[session.id()];
            }
            reply(protocol::EncodeReply(rid, protocol::RegisterReply{*id}));
          } else {
            reply(protocol::EncodeError(rid, id.status()));
          }
        } else if constexpr (std::is_same_v<T, PublishRequest>) {
          answer(manager_->Publish(sid, m));
        } else if constexpr (std::is_same_v<T, QueryRequest>) {
          answer(manager_->Query(sid, m));
        } else if constexpr (std::is_same_v<T, ClearNamespaceRequest>) {
          answer(manager_->ClearNamespace(sid, m));
        } else if constexpr (std::is_same_v<T, RestoreRequest>) {
          std::shared_ptr<protocol::Session> ref = session.Ref();
          const auto key = std::make_pair(session.id(), rid);
          // The callback may run inline (DRAM-only restores) or later on a lane;
          // `finished` orders it against recording the restore for CancelRestore.
          auto finished = std::make_shared<bool>(false);
          // An inline completion replies from this worker once StartRestore
          // returns (no hop through the session's writer thread: issue 18's
          // round trip); a lane's completion is sent by the writer thread.
          struct InlineReply {
            std::thread::id starter = std::this_thread::get_id();
            bool starting = true;  // guarded by mu_
            std::optional<std::vector<uint8_t>> bytes;
          };
          auto inline_reply = std::make_shared<InlineReply>();
          {
            std::lock_guard<std::mutex> l(mu_);
            if (restores_.count(key)) {
              reply(protocol::EncodeError(
                  rid, Status::InvalidArgument("restore request id " + std::to_string(rid) +
                                               " is already in flight on this session")));
              return;
            }
          }
          Result<RestoreId> started = manager_->StartRestore(
              sid, m, [this, ref, rid, key, finished, inline_reply](Result<RestoreResult> r) {
                std::vector<uint8_t> bytes = r.ok() ? protocol::EncodeReply(rid, *r)
                                                    : protocol::EncodeError(rid, r.status());
                {
                  std::lock_guard<std::mutex> l(mu_);
                  restores_.erase(key);
                  *finished = true;
                  if (inline_reply->starting &&
                      inline_reply->starter == std::this_thread::get_id()) {
                    inline_reply->bytes = std::move(bytes);
                    return;
                  }
                }
                // Lane threads never block on a client's socket.
                ref->SendAsync(std::move(bytes));
              });
          std::optional<std::vector<uint8_t>> now;
          {
            std::lock_guard<std::mutex> l(mu_);
            inline_reply->starting = false;
            now = std::move(inline_reply->bytes);
            if (started.ok() && !*finished) restores_[key] = *started;
          }
          if (!started.ok()) {
            reply(protocol::EncodeError(rid, started.status()));
          } else if (now) {
            reply(*now);
          }
        } else if constexpr (std::is_same_v<T, protocol::CancelRestoreRequest>) {
          RestoreId target = 0;
          {
            std::lock_guard<std::mutex> l(mu_);
            auto it = restores_.find({session.id(), m.restore_id});
            if (it != restores_.end()) target = it->second;
          }
          protocol::CancelRestoreReply c;
          if (target != 0) {
            Result<uint32_t> released = manager_->CancelRestore(sid, target);
            c.cancelled = released.ok() && *released > 0;
          }
          reply(protocol::EncodeReply(rid, c));
        } else if constexpr (std::is_same_v<T, PrepareRequest>) {
          Result<uint32_t> n = manager_->Prepare(sid, m);
          if (!n.ok()) {
            reply(protocol::EncodeError(rid, n.status()));
          } else {
            protocol::PrepareReply p;
            p.queued = *n;
            p.skipped = static_cast<uint32_t>(m.keys.size()) - *n;
            reply(protocol::EncodeReply(rid, p));
          }
        } else if constexpr (std::is_same_v<T, protocol::ReleaseQueryRequest>) {
          Status st = manager_->ReleaseQuery(sid, m.query);
          if (st.ok()) {
            reply(protocol::EncodeReply(rid, protocol::ReleaseQueryReply{}));
          } else {
            reply(protocol::EncodeError(rid, st));
          }
        } else if constexpr (std::is_same_v<T, protocol::UnregisterRequest>) {
          Status st = manager_->UnregisterInstance(sid, m.instance);
          if (st.ok()) {
            {
              std::lock_guard<std::mutex> l(mu_);
              if (uint32_t& n = instances_[session.id()]; n > 0) --n;
            }
            reply(protocol::EncodeReply(rid, protocol::UnregisterReply{}));
          } else {
            reply(protocol::EncodeError(rid, st));
          }
        } else {
          bad_frames_->Inc();
          reply(protocol::EncodeError(
              rid, Status::InvalidArgument(std::string("unexpected message ") +
                                           std::string(protocol::MessageName(decoded->body)))));
        }
      },
      decoded->body);
}

}  // namespace orbitkv
