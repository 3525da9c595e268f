#include "workload/live_line.h"

#include <cstdio>

namespace orbitkv::demo {

LiveLine::LiveLine(bool live, std::chrono::milliseconds period)
    : live_(live), period_(period), start_(std::chrono::steady_clock::now()), last_(start_) {}

bool LiveLine::Due() const { return std::chrono::steady_clock::now() - last_ >= period_; }

double LiveLine::Elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void LiveLine::Show(std::string line) {
  last_ = std::chrono::steady_clock::now();
  if (live_) {
    const size_t width = line.size();
    if (width < last_width_) line.append(last_width_ - width, ' ');
    last_width_ = width;
    std::fprintf(stdout, "\r%s", line.c_str());
    drawn_ = true;
  } else {
    std::fprintf(stdout, "%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void LiveLine::Finish() {
  if (live_ && drawn_) std::fputc('\n', stdout);
  drawn_ = false;
  last_width_ = 0;
  std::fflush(stdout);
}

}  // namespace orbitkv::demo
