// ScriptedIoFaults: the test IoFaultInjector. Counts completions per op and
// applies the first rule that matches; rules count from when they were added.
#include "io/io_engine.h"

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace orbitkv {

struct ScriptedIoFaults::State {
  std::mutex mu;
  uint64_t completions[2] = {0, 0};              // guarded by mu; by IoOp
  std::vector<std::pair<Rule, uint64_t>> rules;  // guarded by mu; rule, count when added
};

std::shared_ptr<ScriptedIoFaults::State> ScriptedIoFaults::MakeState() {
  return std::make_shared<State>();
}

namespace {

size_t OpIndex(IoOp op) { return op == IoOp::kRead ? 0 : 1; }

// A short transfer that O_DIRECT can continue: half of `res`, rounded down to
// 4 KiB, else to 512 bytes, else plain half. Always in (0, res) for res >= 2.
int Shorten(int res) {
  if (res < 2) return res;
  const int half = res / 2;
  if (int r = half & ~4095; r > 0) return r;
  if (int r = half & ~511; r > 0) return r;
  return half;
}

}  // namespace

void ScriptedIoFaults::AddRule(Rule rule) {
  rule.nth = std::max<uint64_t>(rule.nth, 1);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->rules.emplace_back(rule, state_->completions[OpIndex(rule.op)]);
}

void ScriptedIoFaults::Clear() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->rules.clear();
}

uint64_t ScriptedIoFaults::Completions(IoOp op) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completions[OpIndex(op)];
}

int ScriptedIoFaults::OnCompletion(const IoRequest& req, uint64_t offset, size_t submitted,
                                   int res) {
  std::optional<Rule> fired;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    const uint64_t count = ++state_->completions[OpIndex(req.op)];
    for (const auto& [rule, base] : state_->rules) {
      if (rule.op != req.op) continue;
      const uint64_t nth_since_added = count - base;
      if (rule.every ? nth_since_added >= rule.nth : nth_since_added == rule.nth) {
        fired = rule;
        break;
      }
    }
  }
  if (!fired) return res;
  switch (fired->fault) {
    case Fault::kError:
      return -(fired->err > 0 ? fired->err : EIO);
    case Fault::kShort:
      return Shorten(res);
    case Fault::kZero:
      return 0;
    case Fault::kStall:
      if (fired->stall.count() > 0) std::this_thread::sleep_for(fired->stall);
      return res;
  }
  return res;
}

}  // namespace orbitkv
