// LiveLine: one progress line for a driver's terminal. On a terminal (`live`)
// the line is redrawn in place with \r; otherwise a plain line is printed every
// `period`, so logs stay readable. Writes to stdout. One thread.
#pragma once

#include <chrono>
#include <string>

namespace orbitkv::demo {

class LiveLine {
 public:
  LiveLine(bool live, std::chrono::milliseconds period);
  // True when a redraw is due (the caller then builds the line and calls Show).
  bool Due() const;
  // Draws `line` now.
  void Show(std::string line);
  // Ends a live line with a newline (no-op otherwise).
  void Finish();
  bool live() const { return live_; }
  // Seconds since construction.
  double Elapsed() const;

 private:
  bool live_;
  std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point start_, last_;
  size_t last_width_ = 0;
  bool drawn_ = false;
};

}  // namespace orbitkv::demo
