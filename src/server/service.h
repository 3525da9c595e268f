// ManagerService: the engine protocol's server side. Decodes each frame a
// session sends, calls the Manager, and replies with the same envelope id.
// A frame that does not decode gets an ErrorReply (addressed to its id when
// the envelope is readable) and the session stays open; nothing a client
// sends can touch memory outside its registrations. Restores reply
// asynchronously from the Manager's lanes; CancelRestore names the restore's
// request id. Closing a session (including a client killed with SIGKILL)
// releases everything its instances held. Thread-safe: a session's frames
// arrive one at a time, in order, on whichever of the SocketServer's request
// threads takes them (protocol/server.h); different sessions' frames run at
// once. Every request is timed into orbitkv_request_seconds{op} and
// orbitkv_request_wait_seconds{op} (below).
#pragma once

#include <array>
#include <map>
#include <mutex>
#include <unordered_map>

#include "manager/manager.h"
#include "protocol/server.h"
#include "protocol/wire.h"

namespace orbitkv {

class ManagerService final : public protocol::SessionHandler {
 public:
  explicit ManagerService(Manager* manager, MetricsRegistry* metrics);
  void OnOpen(protocol::Session& session) override;
  void OnFrame(protocol::Session& session, protocol::Frame&& frame) override;
  void OnClose(protocol::Session& session) override;
  // Idle sessions may be closed only while they own no instance.
  bool MayCloseIdle(const protocol::Session& session) override;

 private:
  SessionId ManagerSession(const protocol::Session& session);

  Manager* const manager_;
  Counter* bad_frames_;
  Counter* requests_;
  // By Message's variant index; null for the bodies that are replies.
  // orbitkv_request_seconds{op}: from the loop reading a request's last byte
  // to its handler returning (reply sent; a restore: started, or replied
  // when it completed inline). orbitkv_request_wait_seconds{op}: the part of
  // that before a request thread took the frame up.
  std::array<Histogram*, std::variant_size_v<protocol::Message>> request_seconds_{};
  std::array<Histogram*, std::variant_size_v<protocol::Message>> request_wait_seconds_{};
  std::mutex mu_;
  std::unordered_map<uint64_t, SessionId> sessions_;  // guarded by mu_: socket session -> Manager
  std::unordered_map<uint64_t, uint32_t>
      instances_;  // guarded by mu_: registered, per socket session
  // (socket session, restore request id) -> RestoreId, while the restore runs.
  std::map<std::pair<uint64_t, uint64_t>, RestoreId> restores_;  // guarded by mu_
};

}  // namespace orbitkv
