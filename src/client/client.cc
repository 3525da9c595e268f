#include "orbitkv/client.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "protocol/connection.h"
#include "protocol/wire.h"

namespace orbitkv {

std::string DefaultSocketDirectory() {
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run && *run) return run;
  return "/tmp/orbitkv-" + std::to_string(::geteuid());
}

std::string DefaultSocketPath() { return DefaultSocketDirectory() + "/orbitkv.sock"; }

namespace {

class SocketClient final : public Client {
 public:
  SocketClient(std::unique_ptr<protocol::ClientConnection> conn, ClientConfig config)
      : conn_(std::move(conn)), config_(std::move(config)) {}
  ~SocketClient() override { Close(); }

  // Sends a request and decodes the reply, which must be `Reply` or an error.
  template <typename Reply, typename Request>
  Result<Reply> Call(const Request& req, std::span<const int> fds = {}, uint64_t id = 0) {
    if (id == 0) id = conn_->NextId();
    std::vector<uint8_t> bytes = protocol::EncodeRequest(id, req);
    return Decode<Reply>(conn_->Call(bytes, fds, id, config_.timeout));
  }

  template <typename Reply>
  static Result<Reply> Decode(Result<protocol::Frame> reply) {
    ORBITKV_ASSIGN_OR_RETURN(protocol::Frame frame, std::move(reply));
    ORBITKV_ASSIGN_OR_RETURN(protocol::DecodedMessage msg, protocol::DecodeMessage(frame.payload));
    if (auto* err = std::get_if<protocol::ErrorReply>(&msg.body)) return err->status;
    if (auto* reply = std::get_if<Reply>(&msg.body)) return std::move(*reply);
    return Status::Internal(std::string("unexpected reply ") +
                            std::string(protocol::MessageName(msg.body)));
  }

  // Host: the memfds ride on the frame (SCM_RIGHTS). CUDA: request.ipc_handles
  // are encoded in the message and region_fds is empty. The Manager checks
  // which is which (CheckAttachedFds, DecodeMessage), so a mix-up comes back
  // as its InvalidArgument.
  Result<InstanceId> RegisterInstance(const RegisterRequest& request,
                                      std::span<const int> region_fds) override {
    ORBITKV_ASSIGN_OR_RETURN(protocol::RegisterReply r,
                             Call<protocol::RegisterReply>(request, region_fds));
    return r.instance;
  }
  Status UnregisterInstance(InstanceId instance) override {
    return Call<protocol::UnregisterReply>(protocol::UnregisterRequest{instance}).status();
  }
  Result<PublishResult> Publish(const PublishRequest& request) override {
    return Call<PublishResult>(request);
  }
  Result<QueryResult> Query(const QueryRequest& request) override {
    return Call<QueryResult>(request);
  }
  Status ReleaseQuery(InstanceId instance, QueryId query) override {
    return Call<protocol::ReleaseQueryReply>(protocol::ReleaseQueryRequest{instance, query})
        .status();
  }
  uint64_t NewTicket() override { return conn_->NextId(); }
  // The restore-timeout contract (client.h): past the deadline, cancel and
  // wait a bounded grace for the Manager's completion of this restore.
  Result<RestoreResult> Restore(const RestoreRequest& request, uint64_t ticket) override {
    const uint64_t id = ticket != 0 ? ticket : conn_->NextId();
    ORBITKV_RETURN_IF_ERROR(conn_->Start(protocol::EncodeRequest(id, request), {}, id));
    Result<protocol::Frame> reply = conn_->Wait(id, config_.timeout);
    if (reply.ok() || reply.status().code() != StatusCode::kDeadlineExceeded) {
      return Decode<RestoreResult>(std::move(reply));
    }
    const uint64_t cancel_id = conn_->NextId();
    if (conn_
            ->Start(protocol::EncodeRequest(cancel_id, protocol::CancelRestoreRequest{id}), {},
                    cancel_id)
            .ok()) {
      conn_->Abandon(cancel_id);  // the restore's own reply is the confirmation
    }
    reply = conn_->Wait(id, config_.restore_cancel_grace);
    if (reply.ok() || reply.status().code() != StatusCode::kDeadlineExceeded) {
      return Decode<RestoreResult>(std::move(reply));
    }
    return StillOwned(id, config_.timeout + config_.restore_cancel_grace);
  }
  Result<RestoreResult> WaitRestore(uint64_t ticket, std::chrono::milliseconds timeout) override {
    Result<protocol::Frame> reply = conn_->Wait(ticket, timeout);
    if (!reply.ok() && reply.status().code() == StatusCode::kDeadlineExceeded) {
      return StillOwned(ticket, timeout);
    }
    return Decode<RestoreResult>(std::move(reply));
  }
  static Status StillOwned(uint64_t ticket, std::chrono::milliseconds waited) {
    return Status::DeadlineExceeded(
        "restore " + std::to_string(ticket) + ": the Manager has not confirmed its completion in " +
        std::to_string(waited.count()) +
        " ms (cancel sent); its pages stay owned by the Manager, " +
        "which may still write them, until WaitRestore(" + std::to_string(ticket) + ") returns");
  }
  Result<bool> CancelRestore(uint64_t ticket) override {
    ORBITKV_ASSIGN_OR_RETURN(
        protocol::CancelRestoreReply r,
        Call<protocol::CancelRestoreReply>(protocol::CancelRestoreRequest{ticket}));
    return r.cancelled;
  }
  Result<uint32_t> Prepare(const PrepareRequest& request) override {
    ORBITKV_ASSIGN_OR_RETURN(protocol::PrepareReply r, Call<protocol::PrepareReply>(request));
    return r.queued;
  }
  Result<ClearNamespaceResult> ClearNamespace(InstanceId instance) override {
    return Call<ClearNamespaceResult>(ClearNamespaceRequest{instance});
  }
  void Close() override { conn_->Close(); }
  bool closed() const override { return conn_->closed(); }

 private:
  std::unique_ptr<protocol::ClientConnection> conn_;
  ClientConfig config_;
};

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(const ClientConfig& config) {
  ClientConfig c = config;
  if (c.socket_path.empty()) c.socket_path = DefaultSocketPath();
  protocol::ClientOptions o;
  o.reply_id = [](std::span<const uint8_t> b) { return protocol::PeekEnvelopeId(b); };
  o.server_uid = c.server_uid;
  if (!c.spin_wait) {
    if (const char* env = std::getenv(kClientSpinEnv); env != nullptr) {
      char* end = nullptr;
      errno = 0;
      const unsigned long long us = std::strtoull(env, &end, 10);
      if (*env == '\0' || *end != '\0' || errno != 0 || *env == '-' || us > 10000) {
        return Status::InvalidArgument(std::string(kClientSpinEnv) + "='" + env +
                                       "': not a whole number of microseconds in 0..10000");
      }
      c.spin_wait = std::chrono::microseconds(us);
    }
  }
  if (c.spin_wait) {
    if (c.spin_wait->count() < 0 || *c.spin_wait > std::chrono::milliseconds(10)) {
      return Status::InvalidArgument("ClientConfig::spin_wait " +
                                     std::to_string(c.spin_wait->count()) +
                                     " us: not in 0..10000 us");
    }
    o.spin_wait = *c.spin_wait;
  }
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<protocol::ClientConnection> conn,
                           protocol::ClientConnection::Connect(c.socket_path, o));
  auto client = std::make_unique<SocketClient>(std::move(conn), c);
  protocol::HelloRequest hello;
  hello.client_pid = ::getpid();
  hello.client_name = c.client_name;
  ORBITKV_ASSIGN_OR_RETURN(protocol::HelloReply h, client->Call<protocol::HelloReply>(hello));
  if (h.protocol_version != protocol::kProtocolVersion) {
    return Status::FailedPrecondition("Manager speaks protocol " +
                                      std::to_string(h.protocol_version) + ", client " +
                                      std::to_string(protocol::kProtocolVersion));
  }
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace orbitkv
