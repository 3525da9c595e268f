// CoalesceReads: a greedy sweep over the aligned extents sorted by (file,
// offset). Each member lands whole in exactly one read, unless the member alone
// is larger than max_bytes.
#include "io/coalesce.h"

#include <algorithm>
#include <tuple>

namespace orbitkv {
namespace {

struct Extent {
  uint32_t file;
  uint64_t start;   // aligned down
  uint64_t end;     // aligned up
  uint64_t offset;  // the requested offset, to order members sharing a block
  size_t index;
};

}  // namespace

std::vector<CoalescedRead> CoalesceReads(std::span<const ReadRange> ranges, uint64_t align,
                                         uint64_t max_bytes) {
  // Guards for violated REQUIRES, so a bad caller gets reads no larger than asked.
  if (align == 0) align = 1;
  max_bytes = std::max(max_bytes / align * align, align);

  std::vector<Extent> extents;
  extents.reserve(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ReadRange& r = ranges[i];
    if (r.length == 0) continue;  // nothing to read
    const uint64_t start = r.offset & ~(align - 1);
    const uint64_t end = (r.offset + r.length + align - 1) & ~(align - 1);
    extents.push_back({r.file, start, end, r.offset, i});
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.file, a.start, a.offset, a.index) <
           std::tie(b.file, b.start, b.offset, b.index);
  });

  std::vector<CoalescedRead> out;
  bool open = false;  // out.back() may still grow
  for (const Extent& e : extents) {
    if (e.end - e.start > max_bytes) {
      open = false;
      for (uint64_t at = e.start; at < e.end; at += max_bytes) {
        out.push_back({e.file, at, std::min(max_bytes, e.end - at), {e.index}});
      }
      continue;
    }
    if (open) {
      CoalescedRead& cur = out.back();
      const uint64_t cur_end = cur.offset + cur.length;
      const uint64_t merged_end = std::max(cur_end, e.end);
      if (cur.file == e.file && e.start <= cur_end && merged_end - cur.offset <= max_bytes) {
        cur.length = merged_end - cur.offset;
        cur.members.push_back(e.index);
        continue;
      }
    }
    out.push_back({e.file, e.start, e.end - e.start, {e.index}});
    open = true;
  }
  // Pieces of a split range may precede reads of ranges that begin inside it.
  std::stable_sort(out.begin(), out.end(), [](const CoalescedRead& a, const CoalescedRead& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  return out;
}

}  // namespace orbitkv
