// SetThreadName: names the calling thread (Linux comm, at most 15 bytes; a
// longer name is cut), so that `top -H`, /proc/<pid>/task/<tid>/comm and
// orbitkv-bench's per-thread Manager CPU say which part of the Manager a
// thread is. Every long-lived OrbitKV thread calls it first with an "okv-"
// name: a role, and a worker index where a role has several threads. Threads
// that a library starts inherit their creator's name or take one of their
// own (the CUDA driver's cuda-EvtHandlr, io_uring's iou-wrk-<tid>).
// Thread-safe; affects only the calling thread; never fails the caller.
#pragma once

#include <string>
#include <string_view>

namespace orbitkv {

inline constexpr size_t kMaxThreadName = 15;

// `role` plus, when index >= 0, its decimal index ("okv-ssd-read" 1 ->
// "okv-ssd-read1"), cut to kMaxThreadName bytes keeping the index.
std::string ThreadName(std::string_view role, int index = -1);

void SetThreadName(std::string_view name);

}  // namespace orbitkv
