// orbitkv._orbitkv: the Python binding of the engine-side Client
// (orbitkv/client.h), the layout types (orbitkv/layout.h), engine host pages
// (sealed memfds exposed through the buffer protocol) and a typed exception
// per Status code. The pure-Python package orbitkv re-exports all of it.
//
// Every call that talks to the Manager releases the GIL while it waits, so
// other Python threads run meanwhile and several threads may call one Client
// at once (a restore blocked in one thread can be cancelled from another).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/client.h"
#include "orbitkv/host_memory.h"
#include "orbitkv/layout.h"
#include "orbitkv/status.h"

namespace py = pybind11;

namespace orbitkv::python {
namespace {

// ---- exceptions --------------------------------------------------------------

constexpr size_t kNumCodes = static_cast<size_t>(StatusCode::kInternal) + 1;

// Exception types live as long as the process (leaked references: no static
// py::object destructor runs after the interpreter is gone).
PyObject* g_base_error = nullptr;
std::array<PyObject*, kNumCodes> g_errors{};
// Client.restore's DeadlineExceeded: the pages are still the Manager's.
PyObject* g_restore_still_owned = nullptr;

PyObject* NewError(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("orbitkv.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

void DefineErrors(py::module_& m) {
  g_base_error = NewError(m, "OrbitKVError", PyExc_Exception,
                          "Base of every error the Manager or the client reports. Attributes: "
                          "code (the Status code name, e.g. 'NotFound'), err_no (errno for I/O "
                          "errors, else 0), retryable, data_loss. str() is Status::ToString().");
  auto sub = [&](StatusCode code, const char* name, const char* doc, PyObject* extra = nullptr) {
    PyObject* bases = extra ? PyTuple_Pack(2, g_base_error, extra) : PyTuple_Pack(1, g_base_error);
    if (bases == nullptr) throw py::error_already_set();
    PyObject* type = NewError(m, name, bases, doc);
    Py_DECREF(bases);
    g_errors[static_cast<size_t>(code)] = type;
    return type;
  };
  sub(StatusCode::kInvalidArgument, "InvalidArgumentError",
      "The Manager rejected an argument (also a ValueError).", PyExc_ValueError);
  sub(StatusCode::kNotFound, "NotFoundError",
      "An instance, query or ticket is unknown (or expired).");
  PyObject* io = sub(StatusCode::kIOError, "OrbitIOError", "An I/O operation failed.");
  // NoSpace is an I/O error too: catching OrbitIOError catches it.
  {
    PyObject* bases = PyTuple_Pack(1, io);
    if (bases == nullptr) throw py::error_already_set();
    g_errors[static_cast<size_t>(StatusCode::kNoSpace)] =
        NewError(m, "NoSpaceError", bases, "Storage is full (ENOSPC / EDQUOT).");
    Py_DECREF(bases);
  }
  sub(StatusCode::kBusy, "BusyError", "A resource is pinned or in use; retrying may work.");
  sub(StatusCode::kUnavailable, "UnavailableError",
      "A capability is not there (no Manager listening, no GPU, no shard).");
  sub(StatusCode::kCancelled, "OrbitCancelledError",
      "The operation was cancelled, or the connection was closed or broke.");
  PyObject* deadline = sub(StatusCode::kDeadlineExceeded, "DeadlineExceededError",
                           "No reply within the client's timeout, or the Manager closed an idle "
                           "connection or an unfinished message (--idle-timeout-ms, "
                           "--frame-timeout-ms).",
                           PyExc_TimeoutError);
  {
    PyObject* bases = PyTuple_Pack(1, deadline);
    if (bases == nullptr) throw py::error_already_set();
    g_restore_still_owned = NewError(
        m, "RestoreStillOwnedError", bases,
        "Client.restore passed its timeout and the Manager did not confirm the cancelled "
        "restore's completion within the grace: its pages are still owned by the Manager, which "
        "may still write them. Attribute: ticket. Call Client.wait_restore(ticket) until it "
        "returns before reusing the pages.");
    Py_DECREF(bases);
  }
  sub(StatusCode::kCorruption, "CorruptionError", "Stored data failed its checks.");
  sub(StatusCode::kAlreadyExists, "AlreadyExistsError", "The object already exists.");
  sub(StatusCode::kFailedPrecondition, "FailedPreconditionError",
      "The call is not valid in this state (e.g. the Client is closed).");
  sub(StatusCode::kResourceExhausted, "ResourceExhaustedError", "A budget or pool is exhausted.");
  sub(StatusCode::kPermissionDenied, "PermissionDeniedError", "Permission denied.");
  sub(StatusCode::kInternal, "InternalError", "A bug in OrbitKV.");
}

PyObject* ErrorType(StatusCode code) {
  const size_t i = static_cast<size_t>(code);
  if (i < kNumCodes && g_errors[i] != nullptr) return g_errors[i];
  return g_base_error;
}

// Builds the typed exception for `st` (not OK). REQUIRES: the GIL.
py::object MakeError(const Status& st) {
  PyObject* type = ErrorType(st.code());
  py::object exc = py::reinterpret_borrow<py::object>(type)(st.ToString());
  exc.attr("code") = py::str(std::string(StatusCodeName(st.code())));
  exc.attr("err_no") = st.err_no();
  exc.attr("retryable") = st.retryable();
  exc.attr("data_loss") = st.data_loss();
  return exc;
}

[[noreturn]] void ThrowStatus(const Status& st) {
  py::object exc = MakeError(st);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// A restore's DeadlineExceeded (client.h: its pages are still owned).
[[noreturn]] void ThrowRestoreStatus(const Status& st, uint64_t ticket) {
  if (st.code() != StatusCode::kDeadlineExceeded) ThrowStatus(st);
  py::object exc = py::reinterpret_borrow<py::object>(g_restore_still_owned)(st.ToString());
  exc.attr("code") = py::str(std::string(StatusCodeName(st.code())));
  exc.attr("err_no") = 0;
  exc.attr("retryable") = st.retryable();
  exc.attr("data_loss") = false;
  exc.attr("ticket") = ticket;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

template <typename T>
T Unwrap(Result<T>&& r) {
  if (!r.ok()) ThrowStatus(r.status());
  return std::move(r).value();
}

void Check(const Status& st) {
  if (!st.ok()) ThrowStatus(st);
}

[[noreturn]] void ThrowOSError() {
  PyErr_SetFromErrno(PyExc_OSError);
  throw py::error_already_set();
}

// ---- argument conversion -----------------------------------------------------

std::string TypeName(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

// A Python integer (or anything with __index__, e.g. numpy.int64) in [0, max].
uint64_t ToUnsigned(py::handle h, uint64_t max, const std::string& what) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr())) {
    throw py::type_error(what + " must be an int, not " + TypeName(h));
  }
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long s = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (s == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow < 0 || (overflow == 0 && s < 0)) {
    throw py::value_error(what + " must be >= 0, got " + std::string(py::str(i)));
  }
  unsigned long long u = 0;
  if (overflow > 0) {
    u = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error(what + " is too large: " + std::string(py::str(i)));
    }
  } else {
    u = static_cast<unsigned long long>(s);
  }
  if (u > max) {
    throw py::value_error(what + " must be <= " + std::to_string(max) + ", got " +
                          std::to_string(u));
  }
  return u;
}

// A list (any iterable except str/bytes) of such integers.
template <typename T>
std::vector<T> ToUnsignedList(py::handle seq, const std::string& what) {
  if (PyUnicode_Check(seq.ptr()) || PyBytes_Check(seq.ptr()) || PyByteArray_Check(seq.ptr()) ||
      !py::isinstance<py::iterable>(seq)) {
    throw py::type_error(what + " must be a list of ints, not " + TypeName(seq));
  }
  std::vector<T> out;
  size_t i = 0;
  for (py::handle item : seq) {
    out.push_back(static_cast<T>(
        ToUnsigned(item, std::numeric_limits<T>::max(), what + "[" + std::to_string(i) + "]")));
    ++i;
  }
  return out;
}

// Exactly N bytes from bytes (or any contiguous buffer: bytearray,
// memoryview...); `what` names the argument, `note` says what it is.
template <size_t N>
std::array<uint8_t, N> ToFixedBytes(py::handle h, const std::string& what,
                                    const std::string& note = "") {
  std::array<uint8_t, N> out{};
  auto wrong_length = [&](Py_ssize_t len) {
    return py::value_error(what + " must be exactly " + std::to_string(N) + " bytes" + note +
                           ", got " + std::to_string(len));
  };
  if (PyBytes_Check(h.ptr())) {
    char* data = nullptr;
    Py_ssize_t len = 0;
    if (PyBytes_AsStringAndSize(h.ptr(), &data, &len) != 0) throw py::error_already_set();
    if (len != static_cast<Py_ssize_t>(N)) throw wrong_length(len);
    std::memcpy(out.data(), data, N);
    return out;
  }
  if (!PyUnicode_Check(h.ptr()) && PyObject_CheckBuffer(h.ptr())) {  // bytearray, memoryview...
    Py_buffer view;
    if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
    const Py_ssize_t len = view.len;
    if (len == static_cast<Py_ssize_t>(N)) std::memcpy(out.data(), view.buf, N);
    PyBuffer_Release(&view);
    if (len != static_cast<Py_ssize_t>(N)) throw wrong_length(len);
    return out;
  }
  throw py::type_error(what + " must be bytes of length " + std::to_string(N) + note + ", not " +
                       TypeName(h));
}

BlockKey ToKey(py::handle h, size_t index) {
  return ToFixedBytes<32>(h, "keys[" + std::to_string(index) + "]");
}

// register_instance's ipc_handles: a list of 64-byte cudaIpcMemHandle_t.
std::vector<std::array<uint8_t, 64>> ToIpcHandles(py::handle seq) {
  if (PyBytes_Check(seq.ptr()) || PyByteArray_Check(seq.ptr()) || PyUnicode_Check(seq.ptr()) ||
      !py::isinstance<py::iterable>(seq)) {
    throw py::type_error(
        "ipc_handles must be a list of 64-byte bytes objects (one cudaIpcMemHandle_t per "
        "region), not " +
        TypeName(seq));
  }
  std::vector<std::array<uint8_t, 64>> out;
  for (py::handle item : seq) {
    out.push_back(ToFixedBytes<64>(item, "ipc_handles[" + std::to_string(out.size()) + "]",
                                   " (a cudaIpcMemHandle_t)"));
  }
  return out;
}

std::vector<BlockKey> ToKeys(py::handle seq) {
  if (PyBytes_Check(seq.ptr()) || PyByteArray_Check(seq.ptr()) || PyUnicode_Check(seq.ptr()) ||
      !py::isinstance<py::iterable>(seq)) {
    throw py::type_error("keys must be a list of 32-byte bytes objects, not " + TypeName(seq));
  }
  std::vector<BlockKey> out;
  for (py::handle item : seq) out.push_back(ToKey(item, out.size()));
  return out;
}

std::string TierName(Tier t) {
  switch (t) {
    case Tier::kDram:
      return "dram";
    case Tier::kSsd:
      return "ssd";
    case Tier::kNone:
      break;
  }
  return "none";
}

// ---- host pages --------------------------------------------------------------

// One HostMemory (a sealed memfd, what the Manager requires) exported through
// the buffer protocol.
class HostPages {
 public:
  HostPages(uint64_t size, const std::string& name) : size_(size) {
    if (size == 0) throw py::value_error("HostPages size must be > 0");
    if (size > static_cast<uint64_t>(std::numeric_limits<Py_ssize_t>::max())) {
      throw py::value_error("HostPages size too large");
    }
    Result<HostMemory> m = HostMemory::Create(size, name);
    if (!m.ok()) {
      errno = m.status().err_no() != 0 ? m.status().err_no() : EINVAL;
      ThrowOSError();
    }
    memory_ = std::move(m).value();
    fd_ = memory_.fd();
    data_ = memory_.data();
  }
  ~HostPages() { Release(); }
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;

  void Close() {
    if (exports_ > 0) {
      throw py::buffer_error("cannot close HostPages: " + std::to_string(exports_) +
                             " exported buffer(s) (memoryview, numpy array...) still alive");
    }
    Release();
  }
  bool closed() const { return data_ == nullptr; }
  int fd() const {
    if (closed()) throw py::value_error("HostPages is closed");
    return fd_;
  }
  uint64_t size() const { return size_; }
  uint8_t* data() const { return data_; }
  int exports() const { return exports_; }

  // Buffer protocol slots (the GIL is held).
  static int GetBuffer(PyObject* obj, Py_buffer* view, int flags) {
    view->obj = nullptr;
    HostPages* self = nullptr;
    try {
      self = py::handle(obj).cast<HostPages*>();
    } catch (const std::exception&) {
      self = nullptr;
    }
    if (self == nullptr) {
      PyErr_SetString(PyExc_BufferError, "HostPages is not initialised");
      return -1;
    }
    if (self->closed()) {
      PyErr_SetString(PyExc_ValueError, "HostPages is closed");
      return -1;
    }
    if (PyBuffer_FillInfo(view, obj, self->data_, static_cast<Py_ssize_t>(self->size_),
                          /*readonly=*/0, flags) != 0) {
      return -1;
    }
    ++self->exports_;
    return 0;
  }
  static void ReleaseBuffer(PyObject* obj, Py_buffer*) {
    try {
      if (HostPages* self = py::handle(obj).cast<HostPages*>()) --self->exports_;
    } catch (const std::exception&) {
    }
  }

 private:
  void Release() {
    memory_ = HostMemory();  // unmaps and closes
    data_ = nullptr;
    fd_ = -1;
  }

  uint64_t size_ = 0;
  HostMemory memory_;
  int fd_ = -1;              // memory_.fd() while open
  uint8_t* data_ = nullptr;  // memory_.data() while open
  int exports_ = 0;          // live Py_buffer exports; guarded by the GIL
};

// ---- layouts -----------------------------------------------------------------
// SlotLayout is the C++ struct itself. GroupLayout and InstanceLayout keep
// their list fields as Python lists, so that `group.slots.append(...)` and
// `layout.groups[0].slots[1].offset = ...` change the layout (no copies);
// they are converted (and type-checked) when the layout is used.

struct PyGroupLayout {
  uint32_t group_id = 0;
  uint32_t num_slots = 0;
  py::list slot_bytes;
  py::list slots;
};

struct PyInstanceLayout {
  uint64_t num_pages = 0;
  py::list region_bytes;
  py::list groups;
};

// A new list with the items of `seq`. Always a copy, even of a list: a layout
// owns its lists, so a shared default argument or a list the caller keeps
// changing never leaks into another layout.
py::list ToList(py::handle seq, const char* what) {
  if (PyUnicode_Check(seq.ptr()) || PyBytes_Check(seq.ptr()) ||
      !py::isinstance<py::iterable>(seq)) {
    throw py::type_error(std::string(what) + " must be a list, not " + TypeName(seq));
  }
  PyObject* copy = PySequence_List(seq.ptr());
  if (copy == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::list>(copy);
}

GroupLayout ToGroup(const PyGroupLayout& g) {
  GroupLayout out;
  out.group_id = g.group_id;
  out.num_slots = g.num_slots;
  out.slot_bytes = ToUnsignedList<uint64_t>(g.slot_bytes, "GroupLayout.slot_bytes");
  size_t i = 0;
  for (py::handle s : g.slots) {
    if (!py::isinstance<SlotLayout>(s)) {
      throw py::type_error("GroupLayout.slots[" + std::to_string(i) +
                           "] must be a SlotLayout, not " + TypeName(s));
    }
    out.slots.push_back(s.cast<SlotLayout>());
    ++i;
  }
  return out;
}

InstanceLayout ToLayout(const PyInstanceLayout& l) {
  InstanceLayout out;
  out.num_pages = l.num_pages;
  out.region_bytes = ToUnsignedList<uint64_t>(l.region_bytes, "InstanceLayout.region_bytes");
  size_t i = 0;
  for (py::handle g : l.groups) {
    if (!py::isinstance<PyGroupLayout>(g)) {
      throw py::type_error("InstanceLayout.groups[" + std::to_string(i) +
                           "] must be a GroupLayout, not " + TypeName(g));
    }
    out.groups.push_back(ToGroup(g.cast<const PyGroupLayout&>()));
    ++i;
  }
  return out;
}

bool SlotEq(const SlotLayout& a, const SlotLayout& b) {
  return a.slot_id == b.slot_id && a.region == b.region && a.offset == b.offset &&
         a.page_stride == b.page_stride && a.bytes_per_page == b.bytes_per_page;
}

// register_instance's model: an orbitkv.hybrid.ModelDescription (anything with
// to_dict()) or its dict; the Manager validates it (ValueError-like
// InvalidArgumentError naming the field).
ModelDescription ToModel(py::handle model) {
  py::object d = py::hasattr(model, "to_dict") ? model.attr("to_dict")()
                                               : py::reinterpret_borrow<py::object>(model);
  if (!py::isinstance<py::dict>(d)) {
    throw py::type_error("model must be an orbitkv.hybrid.ModelDescription or its dict, not " +
                         TypeName(model));
  }
  auto get = [](py::handle dict, const char* key, const std::string& what) -> py::object {
    if (!dict.contains(key)) throw py::value_error(what + ": missing '" + key + "'");
    return dict[key];
  };
  ModelDescription out;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  out.key_block_tokens =
      ToUnsigned(get(d, "key_block_tokens", "model"), kMax, "model.key_block_tokens");
  size_t i = 0;
  for (py::handle g : get(d, "groups", "model")) {
    const std::string what = "model.groups[" + std::to_string(i++) + "]";
    if (!py::isinstance<py::dict>(g)) throw py::type_error(what + " must be a dict");
    GroupDescription gd;
    gd.name = get(g, "name", what).cast<std::string>();
    gd.kind = static_cast<GroupKind>(ToUnsigned(get(g, "kind", what), 255, what + ".kind"));
    gd.storage_group = static_cast<uint32_t>(ToUnsigned(get(g, "storage_group", what),
                                                        std::numeric_limits<uint32_t>::max(),
                                                        what + ".storage_group"));
    gd.block_tokens = ToUnsigned(get(g, "block_tokens", what), kMax, what + ".block_tokens");
    gd.bytes = ToUnsigned(get(g, "bytes", what), kMax, what + ".bytes");
    if (g.contains("window_tokens")) {
      gd.window_tokens = ToUnsigned(g["window_tokens"], kMax, what + ".window_tokens");
    }
    if (g.contains("checkpoint_interval_tokens")) {
      gd.checkpoint_interval_tokens =
          ToUnsigned(g["checkpoint_interval_tokens"], kMax, what + ".checkpoint_interval_tokens");
    }
    if (g.contains("checkpoint_positions")) {
      gd.checkpoint_positions =
          ToUnsignedList<uint64_t>(g["checkpoint_positions"], what + ".checkpoint_positions");
    }
    out.groups.push_back(std::move(gd));
  }
  return out;
}

// ---- results -----------------------------------------------------------------

struct PyQueryResult {
  uint64_t query = 0;
  uint32_t prefix = 0;
  std::vector<std::string> sources;
  uint64_t logical_bytes = 0;
  bool budget_limited = false;
  uint64_t prefix_tokens = 0;  // hybrid instances
  std::vector<QuerySource> pieces;
  uint64_t not_needed_bytes = 0;
};

struct PyBlockResult {
  uint32_t block = 0;
  std::string source;
  Status status;
};

// ---- client ------------------------------------------------------------------

class PyClient {
 public:
  PyClient(const std::string& socket_path, int64_t timeout_ms, const std::string& client_name,
           std::optional<int64_t> server_uid, int64_t restore_cancel_grace_ms) {
    if (timeout_ms <= 0) throw py::value_error("timeout_ms must be > 0");
    if (restore_cancel_grace_ms <= 0) throw py::value_error("restore_cancel_grace_ms must be > 0");
    if (server_uid && (*server_uid < 0 || *server_uid > std::numeric_limits<uid_t>::max() - 1)) {
      throw py::value_error("server_uid must be a uid (0 .. 2**32-2)");
    }
    ClientConfig c;
    c.socket_path = socket_path;
    c.timeout = std::chrono::milliseconds(timeout_ms);
    c.restore_cancel_grace = std::chrono::milliseconds(restore_cancel_grace_ms);
    c.client_name = client_name;
    if (server_uid) c.server_uid = static_cast<uid_t>(*server_uid);
    socket_path_ = socket_path.empty() ? DefaultSocketPath() : socket_path;
    Result<std::unique_ptr<Client>> r = [&] {
      py::gil_scoped_release nogil;
      return Client::Connect(c);
    }();
    client_ = std::shared_ptr<Client>(Unwrap(std::move(r)));
  }
  ~PyClient() {
    // No call is in flight (each holds a reference to this object).
    if (client_) client_->Close();
  }

  const std::string& socket_path() const { return socket_path_; }
  // Also true once the Manager closed the connection or died.
  bool closed() const { return client_ == nullptr || client_->closed(); }

  InstanceId RegisterInstance(const std::string& ns, uint32_t rank, const std::string& device,
                              const PyInstanceLayout& layout, py::handle regions,
                              py::handle ipc_handles, py::handle model,
                              const std::string& storage_codec, const std::string& kv_dtype,
                              uint32_t head_dim) {
    RegisterRequest req;
    req.ns = ns;
    req.rank = rank;
    req.device = device;
    req.storage = {storage_codec, kv_dtype, head_dim};
    req.layout = ToLayout(layout);
    if (!model.is_none()) req.model = ToModel(model);
    if (!ipc_handles.is_none()) req.ipc_handles = ToIpcHandles(ipc_handles);
    std::vector<int> fds;
    py::object no_regions;  // keeps the empty list alive while `regions` names it
    if (regions.is_none()) {
      no_regions = py::list();
      regions = no_regions;
    }
    if (PyUnicode_Check(regions.ptr()) || !py::isinstance<py::iterable>(regions)) {
      throw py::type_error("regions must be a list of HostPages or file descriptors");
    }
    size_t i = 0;
    for (py::handle r : regions) {
      const std::string what = "regions[" + std::to_string(i++) + "]";
      if (py::isinstance<HostPages>(r)) {
        fds.push_back(r.cast<const HostPages&>().fd());
      } else if (PyIndex_Check(r.ptr()) && !PyBool_Check(r.ptr())) {
        fds.push_back(static_cast<int>(ToUnsigned(r, std::numeric_limits<int>::max(), what)));
      } else if (py::hasattr(r, "fileno")) {
        fds.push_back(static_cast<int>(
            ToUnsigned(r.attr("fileno")(), std::numeric_limits<int>::max(), what + ".fileno()")));
      } else {
        throw py::type_error(what + " must be HostPages or a file descriptor, not " + TypeName(r));
      }
    }
    return Blocking([&](Client& c) { return c.RegisterInstance(req, fds); });
  }

  void UnregisterInstance(InstanceId instance) {
    std::shared_ptr<Client> c = Get();
    Status st = [&] {
      py::gil_scoped_release nogil;
      return c->UnregisterInstance(instance);
    }();
    Check(st);
  }

  PublishResult Publish(InstanceId instance, uint32_t group_id, py::handle keys, py::handle pages,
                        py::handle slot_ids) {
    PublishRequest req;
    req.instance = instance;
    req.group_id = group_id;
    req.keys = ToKeys(keys);
    req.pages = ToUnsignedList<uint64_t>(pages, "pages");
    if (!slot_ids.is_none()) req.slot_ids = ToUnsignedList<uint32_t>(slot_ids, "slot_ids");
    if (req.pages.size() != req.keys.size()) {
      throw py::value_error("publish: " + std::to_string(req.keys.size()) + " keys but " +
                            std::to_string(req.pages.size()) + " pages (one page per key)");
    }
    return Blocking([&](Client& c) { return c.Publish(req); });
  }

  PyQueryResult Query(InstanceId instance, uint32_t group_id, py::handle keys, uint32_t ttl_ms) {
    QueryRequest req;
    req.instance = instance;
    req.group_id = group_id;
    req.keys = ToKeys(keys);
    req.ttl_ms = ttl_ms;
    QueryResult r = Blocking([&](Client& c) { return c.Query(req); });
    PyQueryResult out;
    out.query = r.query;
    out.prefix = r.prefix;
    out.logical_bytes = r.logical_bytes;
    out.budget_limited = r.budget_limited;
    for (Tier t : r.sources) out.sources.push_back(TierName(t));
    out.prefix_tokens = r.prefix_tokens;
    out.pieces = std::move(r.pieces);
    out.not_needed_bytes = r.not_needed_bytes;
    return out;
  }

  void ReleaseQuery(InstanceId instance, QueryId query) {
    std::shared_ptr<Client> c = Get();
    Status st = [&] {
      py::gil_scoped_release nogil;
      return c->ReleaseQuery(instance, query);
    }();
    Check(st);
  }

  uint64_t NewTicket() { return Get()->NewTicket(); }

  std::vector<PyBlockResult> Restore(InstanceId instance, QueryId query, py::handle blocks,
                                     py::handle pages, uint64_t ticket) {
    RestoreRequest req;
    req.instance = instance;
    req.query = query;
    req.blocks = ToUnsignedList<uint32_t>(blocks, "blocks");
    req.pages = ToUnsignedList<uint64_t>(pages, "pages");
    if (req.pages.size() != req.blocks.size()) {
      throw py::value_error("restore: " + std::to_string(req.blocks.size()) + " blocks but " +
                            std::to_string(req.pages.size()) + " pages (one page per block)");
    }
    std::shared_ptr<Client> c = Get();
    if (ticket == 0) ticket = c->NewTicket();  // named by RestoreStillOwnedError
    Result<RestoreResult> r = [&] {
      py::gil_scoped_release nogil;
      return c->Restore(req, ticket);
    }();
    return Blocks(std::move(r), ticket);
  }

  std::vector<PyBlockResult> WaitRestore(uint64_t ticket, int64_t timeout_ms) {
    if (timeout_ms <= 0) throw py::value_error("timeout_ms must be > 0");
    std::shared_ptr<Client> c = Get();
    Result<RestoreResult> r = [&] {
      py::gil_scoped_release nogil;
      return c->WaitRestore(ticket, std::chrono::milliseconds(timeout_ms));
    }();
    return Blocks(std::move(r), ticket);
  }

  static std::vector<PyBlockResult> Blocks(Result<RestoreResult> result, uint64_t ticket) {
    if (!result.ok()) ThrowRestoreStatus(result.status(), ticket);
    RestoreResult r = std::move(result).value();
    std::vector<PyBlockResult> out;
    out.reserve(r.blocks.size());
    for (BlockResult& b : r.blocks) out.push_back({b.block, TierName(b.source), b.status});
    return out;
  }

  bool CancelRestore(uint64_t ticket) {
    return Blocking([&](Client& c) { return c.CancelRestore(ticket); });
  }

  py::dict ClearNamespace(InstanceId instance) {
    const ClearNamespaceResult r = Blocking([&](Client& c) { return c.ClearNamespace(instance); });
    py::dict out;
    out["dram_objects"] = r.dram_objects;
    out["ssd_objects"] = r.ssd_objects;
    return out;
  }

  uint32_t Prepare(InstanceId instance, uint32_t group_id, py::handle keys) {
    PrepareRequest req;
    req.instance = instance;
    req.group_id = group_id;
    req.keys = ToKeys(keys);
    return Blocking([&](Client& c) { return c.Prepare(req); });
  }

  // Closes the connection: calls blocked in other threads fail with
  // OrbitCancelledError, later calls with FailedPreconditionError. Idempotent.
  void Close() {
    std::shared_ptr<Client> c = std::move(client_);
    client_.reset();
    if (!c) return;
    py::gil_scoped_release nogil;
    c->Close();
    c.reset();  // the last reference may destroy it here, without the GIL
  }

 private:
  std::shared_ptr<Client> Get() const {
    if (!client_) ThrowStatus(Status::FailedPrecondition("client is closed"));
    return client_;
  }

  // Runs f(client) without the GIL; raises the typed error for a failed Result.
  template <typename F>
  auto Blocking(F&& f) -> decltype(Unwrap(f(std::declval<Client&>()))) {
    std::shared_ptr<Client> c = Get();
    auto r = [&] {
      py::gil_scoped_release nogil;
      return f(*c);
    }();
    return Unwrap(std::move(r));
  }

  std::string socket_path_;
  std::shared_ptr<Client> client_;  // null once closed; read and written with the GIL
};

// ---- reprs -------------------------------------------------------------------

std::string Repr(py::handle h) { return py::repr(h); }

std::string SlotRepr(const SlotLayout& s) {
  return "SlotLayout(slot_id=" + std::to_string(s.slot_id) +
         ", region=" + std::to_string(s.region) + ", offset=" + std::to_string(s.offset) +
         ", page_stride=" + std::to_string(s.page_stride) +
         ", bytes_per_page=" + std::to_string(s.bytes_per_page) + ")";
}

}  // namespace
}  // namespace orbitkv::python

PYBIND11_MODULE(_orbitkv, m) {
  using namespace orbitkv;
  using namespace orbitkv::python;
  m.doc() =
      "OrbitKV engine-side binding: Client (the Manager's socket API), layouts, host pages "
      "and typed errors. Import the orbitkv package rather than this module.";

  DefineErrors(m);

  m.attr("MAX_GROUPS") = kMaxGroups;
  m.attr("MAX_SLOTS_PER_GROUP") = kMaxSlotsPerGroup;
  m.attr("MAX_REGIONS") = kMaxRegions;
  m.attr("MAX_SLOT_BYTES") = kMaxSlotBytes;
  m.attr("MAX_PAGES") = kMaxPages;
  m.attr("KEY_BYTES") = sizeof(BlockKey);
  m.def("default_socket_path", &DefaultSocketPath,
        "The Manager's default socket: $XDG_RUNTIME_DIR/orbitkv.sock or "
        "/tmp/orbitkv-$UID/orbitkv.sock.");

  // -- HostPages
  py::class_<HostPages>(m, "HostPages", py::custom_type_setup([](PyHeapTypeObject* heap_type) {
                          heap_type->as_buffer.bf_getbuffer = &HostPages::GetBuffer;
                          heap_type->as_buffer.bf_releasebuffer = &HostPages::ReleaseBuffer;
                          heap_type->ht_type.tp_as_buffer = &heap_type->as_buffer;
                        }),
                        R"doc(HostPages(size, name="orbitkv-pages")

Engine host page memory: a memfd of `size` bytes sealed against shrinking and
growing (F_SEAL_SHRINK | F_SEAL_GROW, as the Manager requires), mapped
read-write. Pass it (or its fd) to Client.register_instance as a region.
Supports the writable buffer protocol: memoryview(pages),
numpy.frombuffer(pages, dtype=...), torch.frombuffer(pages, dtype=...).
close() (or garbage collection) unmaps and closes the fd; it raises
BufferError while views of it are alive.)doc")
      .def(py::init<uint64_t, const std::string&>(), py::arg("size"),
           py::arg("name") = "orbitkv-pages")
      .def_property_readonly("fd", &HostPages::fd, "The memfd (owned by this object).")
      .def("fileno", &HostPages::fd, "The memfd (owned by this object).")
      .def_property_readonly("size", &HostPages::size, "Size in bytes.")
      .def_property_readonly("closed", &HostPages::closed)
      .def("__len__", [](const HostPages& p) { return p.size(); })
      .def(
          "view", [](py::object self) { return py::memoryview(self); },
          "A writable memoryview (format 'B') of the whole region.")
      .def(
          "numpy",
          [](py::object self, py::object dtype) {
            py::module_ np = py::module_::import("numpy");
            if (dtype.is_none()) dtype = np.attr("uint8");
            return np.attr("frombuffer")(self, dtype);
          },
          py::arg("dtype") = py::none(),
          "A writable 1-D numpy array over the region (default dtype uint8).")
      .def("close", &HostPages::Close,
           "Unmaps and closes the memfd. Raises BufferError while views are alive.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](HostPages& p, py::args) {
             p.Close();
             return false;
           })
      .def("__repr__", [](const HostPages& p) {
        return "HostPages(size=" + std::to_string(p.size()) +
               (p.closed() ? ", closed)" : ", fd=" + std::to_string(p.fd()) + ")");
      });

  // -- layouts
  py::class_<SlotLayout>(
      m, "SlotLayout",
      R"doc(SlotLayout(slot_id=0, region=0, offset=0, page_stride=0, bytes_per_page=0)

Where one slot of a storage group lives: slot `slot_id` of page p is
`bytes_per_page` bytes at region[region] + offset + p * page_stride.)doc")
      .def(py::init([](uint32_t slot_id, uint32_t region, uint64_t offset, uint64_t page_stride,
                       uint64_t bytes_per_page) {
             return SlotLayout{slot_id, region, offset, page_stride, bytes_per_page};
           }),
           py::arg("slot_id") = 0, py::arg("region") = 0, py::arg("offset") = 0,
           py::arg("page_stride") = 0, py::arg("bytes_per_page") = 0)
      .def_readwrite("slot_id", &SlotLayout::slot_id)
      .def_readwrite("region", &SlotLayout::region)
      .def_readwrite("offset", &SlotLayout::offset)
      .def_readwrite("page_stride", &SlotLayout::page_stride)
      .def_readwrite("bytes_per_page", &SlotLayout::bytes_per_page)
      .def("page_offset", &SlotPageOffset, py::arg("page"),
           "Byte offset of this slot of `page` inside its region.")
      .def("__eq__",
           [](const SlotLayout& a, py::handle b) {
             return py::isinstance<SlotLayout>(b) && SlotEq(a, b.cast<const SlotLayout&>());
           })
      .def("__repr__", &SlotRepr);
  // Mutable with __eq__: unhashable, like a list.
  m.attr("SlotLayout").attr("__hash__") = py::none();

  py::class_<PyGroupLayout>(m, "GroupLayout",
                            R"doc(GroupLayout(group_id=0, num_slots=None, slot_bytes=[], slots=[])

A storage group: `num_slots` slots of sizes `slot_bytes` (the whole group, all
writers; num_slots defaults to len(slot_bytes)) and `slots`, the SlotLayouts
this instance holds. The constructor and the setters copy the sequences they
are given; the list attributes are then this layout's own live lists.)doc")
      .def(py::init([](uint32_t group_id, py::object num_slots, py::handle slot_bytes,
                       py::handle slots) {
             PyGroupLayout g;
             g.group_id = group_id;
             g.slot_bytes = ToList(slot_bytes, "slot_bytes");
             g.slots = ToList(slots, "slots");
             g.num_slots = num_slots.is_none()
                               ? static_cast<uint32_t>(py::len(g.slot_bytes))
                               : static_cast<uint32_t>(ToUnsigned(
                                     num_slots, std::numeric_limits<uint32_t>::max(), "num_slots"));
             return g;
           }),
           py::arg("group_id") = 0, py::arg("num_slots") = py::none(),
           py::arg("slot_bytes") = py::list(), py::arg("slots") = py::list())
      .def_readwrite("group_id", &PyGroupLayout::group_id)
      .def_readwrite("num_slots", &PyGroupLayout::num_slots)
      .def_property(
          "slot_bytes", [](const PyGroupLayout& g) { return g.slot_bytes; },
          [](PyGroupLayout& g, py::handle v) { g.slot_bytes = ToList(v, "slot_bytes"); })
      .def_property(
          "slots", [](const PyGroupLayout& g) { return g.slots; },
          [](PyGroupLayout& g, py::handle v) { g.slots = ToList(v, "slots"); })
      .def("__eq__",
           [](const PyGroupLayout& a, py::handle bh) {
             if (!py::isinstance<PyGroupLayout>(bh)) return false;
             const auto& b = bh.cast<const PyGroupLayout&>();
             return a.group_id == b.group_id && a.num_slots == b.num_slots &&
                    a.slot_bytes.equal(b.slot_bytes) && a.slots.equal(b.slots);
           })
      .def("__repr__", [](const PyGroupLayout& g) {
        return "GroupLayout(group_id=" + std::to_string(g.group_id) +
               ", num_slots=" + std::to_string(g.num_slots) + ", slot_bytes=" + Repr(g.slot_bytes) +
               ", slots=" + Repr(g.slots) + ")";
      });
  m.attr("GroupLayout").attr("__hash__") = py::none();

  py::class_<PyInstanceLayout>(m, "InstanceLayout",
                               R"doc(InstanceLayout(num_pages=0, region_bytes=[], groups=[])

An instance's pages: page ids are [0, num_pages); `region_bytes` gives the size
of each region passed to register_instance (in order); `groups` the
GroupLayouts. The constructor and the setters copy the sequences they are
given; the list attributes are then this layout's own live lists. validate()
applies the Manager's rules locally.)doc")
      .def(py::init([](uint64_t num_pages, py::handle region_bytes, py::handle groups) {
             PyInstanceLayout l;
             l.num_pages = num_pages;
             l.region_bytes = ToList(region_bytes, "region_bytes");
             l.groups = ToList(groups, "groups");
             return l;
           }),
           py::arg("num_pages") = 0, py::arg("region_bytes") = py::list(),
           py::arg("groups") = py::list())
      .def_readwrite("num_pages", &PyInstanceLayout::num_pages)
      .def_property(
          "region_bytes", [](const PyInstanceLayout& l) { return l.region_bytes; },
          [](PyInstanceLayout& l, py::handle v) { l.region_bytes = ToList(v, "region_bytes"); })
      .def_property(
          "groups", [](const PyInstanceLayout& l) { return l.groups; },
          [](PyInstanceLayout& l, py::handle v) { l.groups = ToList(v, "groups"); })
      .def(
          "validate", [](const PyInstanceLayout& l) { Check(ValidateLayout(ToLayout(l))); },
          "Raises InvalidArgumentError naming the group, slot and field when the layout "
          "breaks a rule (the Manager checks the same on register).")
      .def("__eq__",
           [](const PyInstanceLayout& a, py::handle bh) {
             if (!py::isinstance<PyInstanceLayout>(bh)) return false;
             const auto& b = bh.cast<const PyInstanceLayout&>();
             return a.num_pages == b.num_pages && a.region_bytes.equal(b.region_bytes) &&
                    a.groups.equal(b.groups);
           })
      .def("__repr__", [](const PyInstanceLayout& l) {
        return "InstanceLayout(num_pages=" + std::to_string(l.num_pages) +
               ", region_bytes=" + Repr(l.region_bytes) + ", groups=" + Repr(l.groups) + ")";
      });
  m.attr("InstanceLayout").attr("__hash__") = py::none();

  // -- results
  py::class_<PublishResult>(m, "PublishResult",
                            "stored: objects (or fragments) accepted; sealed: objects that became "
                            "complete and visible; skipped: already cached; dropped: not "
                            "stored, the DRAM pool had no room.")
      .def_readonly("stored", &PublishResult::stored)
      .def_readonly("sealed", &PublishResult::sealed)
      .def_readonly("skipped", &PublishResult::skipped)
      .def_readonly("dropped", &PublishResult::dropped)
      .def("_asdict",
           [](const PublishResult& r) {
             py::dict d;
             d["stored"] = r.stored;
             d["sealed"] = r.sealed;
             d["skipped"] = r.skipped;
             d["dropped"] = r.dropped;
             return d;
           })
      .def("__repr__", [](const PublishResult& r) {
        return "PublishResult(stored=" + std::to_string(r.stored) +
               ", sealed=" + std::to_string(r.sealed) + ", skipped=" + std::to_string(r.skipped) +
               ")";
      });

  py::class_<PyQueryResult>(m, "QueryResult",
                            "query: the id to restore from (0 when nothing is restorable); "
                            "prefix: longest restorable prefix; sources: 'dram' or 'ssd' per "
                            "block of the prefix; logical_bytes: charged to the query budget "
                            "until restore or expiry; budget_limited: the prefix was cut by the "
                            "query budget (the Manager's or this session's share), not a miss.")
      .def_readonly("query", &PyQueryResult::query)
      .def_readonly("prefix", &PyQueryResult::prefix)
      .def_readonly("sources", &PyQueryResult::sources)
      .def_readonly("logical_bytes", &PyQueryResult::logical_bytes)
      .def_readonly("budget_limited", &PyQueryResult::budget_limited)
      .def_readonly("prefix_tokens", &PyQueryResult::prefix_tokens,
                    "Hybrid instances: P, the tokens the plan recovers (0 for dense ones).")
      .def_readonly("pieces", &PyQueryResult::pieces,
                    "Hybrid instances: the plan's sources (QuerySource), one per entry of "
                    "`sources`; restore(blocks=...) indexes this list.")
      .def_readonly("not_needed_bytes", &PyQueryResult::not_needed_bytes,
                    "Hybrid instances: bytes of [0, P) recovery does not read (window blocks "
                    "before P - W, older checkpoints).")
      .def("__repr__", [](const PyQueryResult& r) {
        return "QueryResult(query=" + std::to_string(r.query) +
               ", prefix=" + std::to_string(r.prefix) + ", sources=" + Repr(py::cast(r.sources)) +
               ", logical_bytes=" + std::to_string(r.logical_bytes) +
               ", budget_limited=" + (r.budget_limited ? "True" : "False") +
               (r.pieces.empty() ? std::string()
                                 : ", prefix_tokens=" + std::to_string(r.prefix_tokens) +
                                       ", pieces=" + std::to_string(r.pieces.size())) +
               ")";
      });

  py::class_<QuerySource>(m, "QuerySource",
                          "One source of a hybrid query: group (index into the description's "
                          "groups), storage_group (whose pages a restore writes), index (block "
                          "index; recurrent: the checkpoint's position in tokens), tier ('dram' "
                          "or 'ssd'), bytes.")
      .def_readonly("group", &QuerySource::group)
      .def_readonly("storage_group", &QuerySource::storage_group)
      .def_readonly("index", &QuerySource::index)
      .def_property_readonly("tier", [](const QuerySource& q) { return TierName(q.tier); })
      .def_readonly("bytes", &QuerySource::bytes)
      .def("__repr__", [](const QuerySource& q) {
        return "QuerySource(group=" + std::to_string(q.group) +
               ", storage_group=" + std::to_string(q.storage_group) +
               ", index=" + std::to_string(q.index) + ", tier='" + TierName(q.tier) +
               "', bytes=" + std::to_string(q.bytes) + ")";
      });

  py::class_<PyBlockResult>(m, "BlockResult",
                            "One restored block: block (index into the query's prefix), source "
                            "('dram', 'ssd' or 'none'), ok, error (Status::ToString(), '' when "
                            "ok), code (Status code name).")
      .def_readonly("block", &PyBlockResult::block)
      .def_readonly("source", &PyBlockResult::source)
      .def_property_readonly("ok", [](const PyBlockResult& b) { return b.status.ok(); })
      .def_property_readonly(
          "error", [](const PyBlockResult& b) { return b.status.ok() ? "" : b.status.ToString(); })
      .def_property_readonly(
          "code",
          [](const PyBlockResult& b) { return std::string(StatusCodeName(b.status.code())); })
      .def(
          "raise_for_error", [](const PyBlockResult& b) { Check(b.status); },
          "Raises this block's typed error (OrbitKVError subclass) if it failed.")
      .def("__bool__", [](const PyBlockResult& b) { return b.status.ok(); })
      .def("__repr__", [](const PyBlockResult& b) {
        return "BlockResult(block=" + std::to_string(b.block) + ", source='" + b.source +
               "', ok=" + (b.status.ok() ? "True" : "False") +
               (b.status.ok() ? std::string() : ", error=" + Repr(py::str(b.status.ToString()))) +
               ")";
      });

  // -- client
  py::class_<PyClient>(
      m, "Client",
      R"doc(Client(socket_path="", timeout_ms=60000, client_name="orbitkv-client", server_uid=None, restore_cancel_grace_ms=5000)

A connection to the Manager over its Unix socket (empty path: the default
socket, $XDG_RUNTIME_DIR/orbitkv.sock or /tmp/orbitkv-$UID/orbitkv.sock).
The Manager must run as this process's uid, or as server_uid when given:
another is refused with PermissionDeniedError naming its uid before anything
is sent. When the Manager refuses or closes the connection for a limit, calls
raise its reason (ResourceExhaustedError, PermissionDeniedError,
DeadlineExceededError) and `closed` becomes True, as it does when the Manager
dies. Every call releases the GIL while it waits; several threads may use
one Client at once. Errors raise OrbitKVError subclasses. Usable as a
context manager (closes on exit).)doc")
      .def(py::init<const std::string&, int64_t, const std::string&, std::optional<int64_t>,
                    int64_t>(),
           py::arg("socket_path") = "", py::arg("timeout_ms") = 60000,
           py::arg("client_name") = "orbitkv-client", py::arg("server_uid") = py::none(),
           py::arg("restore_cancel_grace_ms") = 5000)
      .def_property_readonly("socket_path", &PyClient::socket_path)
      .def_property_readonly("closed", &PyClient::closed,
                             "True once closed, or once the Manager closed the connection or died.")
      .def("register_instance", &PyClient::RegisterInstance, py::arg("ns"), py::arg("rank"),
           py::arg("device"), py::arg("layout"), py::arg("regions") = py::list(),
           py::arg("ipc_handles") = py::none(), py::arg("model") = py::none(), py::kw_only(),
           py::arg("storage_codec") = "", py::arg("kv_dtype") = "", py::arg("head_dim") = 0,
           R"doc(Registers an instance with `layout`; returns the instance id.

`model`: a hybrid model's orbitkv.hybrid.ModelDescription (or its to_dict());
None for a dense model. Its groups' storage_group are layout groups; the
Manager refuses one that is invalid or disagrees with the layout
(InvalidArgumentError naming the field). A hybrid instance publishes plain
chain keys per storage group, and its queries return the recovery plan
(QueryResult.prefix_tokens, .pieces); restore(blocks=...) indexes .pieces,
pages are pages of each piece's storage group.

storage_codec: the namespace's SSD storage codec ("" = the Manager's
--storage-codec; none, ans, fp8, turboquant-4, turboquant-3); part of the
namespace's identity. kv_dtype ("bf16", "fp16", "fp8_e4m3fn") and head_dim
describe every slot's elements; the lossy codecs need both.

device "host": `regions` are HostPages (or memfds sealed with F_SEAL_SHRINK),
one per layout.region_bytes entry, and `ipc_handles` is None or empty.

device "cuda:N" (N a decimal 0..1023): `regions` is empty and `ipc_handles`
is a list of 64-byte bytes, one cudaIpcMemHandle_t per layout.region_bytes
entry, each from cudaIpcGetMemHandle on the base of a cudaMalloc allocation on
device N holding at least that region's bytes (a handle names a whole
allocation, mapped from its base: with a caching allocator such as PyTorch's,
the region must start at its segment's base). The allocation must stay alive
until unregister_instance returns.

A handle that is not 64 bytes raises ValueError here; the Manager answers
InvalidArgumentError for a handle count other than the region count, handles
with "host", fds with "cuda:N" or another device, and fails the call (naming
the device) when it cannot serve CUDA memory.)doc")
      .def("unregister_instance", &PyClient::UnregisterInstance, py::arg("instance"))
      .def("publish", &PyClient::Publish, py::arg("instance"), py::arg("group_id"), py::arg("keys"),
           py::arg("pages"), py::arg("slot_ids") = py::none(),
           "Stores page pages[i] under keys[i] (32-byte bytes). slot_ids: empty/None for "
           "every slot this instance holds, else a fragment (these slots only). When it "
           "returns the pages may be reused. Returns a PublishResult.")
      .def("query", &PyClient::Query, py::arg("instance"), py::arg("group_id"), py::arg("keys"),
           py::arg("ttl_ms") = 30000,
           "Looks up a key chain (key i names blocks 0..i). Returns a QueryResult whose "
           "leases expire after ttl_ms.")
      .def("release_query", &PyClient::ReleaseQuery, py::arg("instance"), py::arg("query"),
           "Releases the sources a query still holds (blocks that will not be restored), "
           "instead of waiting for its ttl.")
      .def("new_ticket", &PyClient::NewTicket,
           "A ticket naming a later restore, for cancel_restore from another thread.")
      .def("restore", &PyClient::Restore, py::arg("instance"), py::arg("query"), py::arg("blocks"),
           py::arg("pages"), py::arg("ticket") = 0,
           R"doc(Copies blocks[i] of the query's prefix into page pages[i]. Returns one
BlockResult per block (per-block failures do not raise).

Timeout contract: the pages belong to the Manager until the restore completes.
Within timeout_ms the reply is that completion. Past it the client cancels the
restore and waits up to restore_cancel_grace_ms for the completion, and
returns it when it comes (blocks the cancel caught report an error; the others
were restored): whenever restore returns, or raises anything other than
RestoreStillOwnedError, the Manager writes no more of these pages. If the
Manager does not answer in the grace (it is stalled), restore raises
RestoreStillOwnedError (a DeadlineExceededError) carrying the ticket: the
Manager may still write the pages, so do not reuse them until
wait_restore(ticket) returns.)doc")
      .def("wait_restore", &PyClient::WaitRestore, py::arg("ticket"), py::arg("timeout_ms") = 60000,
           "Waits for the completion of a restore that raised RestoreStillOwnedError; returns "
           "its BlockResults. Raises RestoreStillOwnedError again if it does not come within "
           "timeout_ms, InvalidArgumentError if no restore of that ticket is outstanding.")
      .def("cancel_restore", &PyClient::CancelRestore, py::arg("ticket"),
           "True if something of that restore not yet submitted was released.")
      .def("prepare", &PyClient::Prepare, py::arg("instance"), py::arg("group_id"), py::arg("keys"),
           "Warms SSD objects into DRAM; returns how many were queued.")
      .def("clear_namespace", &PyClient::ClearNamespace, py::arg("instance"),
           "Drops every object of the namespace of this client's instance, in DRAM and on "
           "SSD; other namespaces are untouched. Returns {'dram_objects': n, 'ssd_objects': "
           "m}, the objects dropped. Restores already holding an object finish with it.")
      .def("close", &PyClient::Close,
           "Closes the connection (the Manager unregisters this client's instances). "
           "Idempotent; later calls raise FailedPreconditionError.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyClient& c, py::args) {
             c.Close();
             return false;
           })
      .def("__repr__", [](const PyClient& c) {
        return "Client(socket_path=" + Repr(py::str(c.socket_path())) +
               (c.closed() ? ", closed)" : ")");
      });
}
