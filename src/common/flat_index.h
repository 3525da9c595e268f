// FlatIndex: an open-addressing hash index of pointers to elements that carry
// their own keys (a directory over objects owned elsewhere).
//
// Why not std::unordered_map: a lookup there walks a bucket array, then a
// heap node (and, for a key held by pointer, the element too), and re-hashes
// or compares every node of a chain. Here a slot is 16 bytes (the key's full
// hash and the pointer), so a lookup reads one slot (rarely a few, adjacent)
// and dereferences only the element whose hash matches: the element the
// caller needs anyway. Linear probing, the slot from the high bits of the hash
// times a Fibonacci constant (so weak hashes such as sequential ids spread),
// backward-shift deletion (no tombstones), at most 3/4 full; it doubles when
// full and halves below 1/16 (never below 16 slots), unless made with
// kKeepPeak: then it keeps its largest size until Clear() (an index that
// fills and empties over and over, as a query's leases do, rehashes on every
// cycle otherwise). Memory: 16 bytes per slot, 21 to 43 bytes per element
// while it grows (memory_bytes()).
//
// Why not absl::flat_hash_map (the same design): it has no removal by
// identity nor a prefetch of the element behind a slot (a chain walk misses
// on both), and linking Abseil adds its shared libraries to every bundle the
// GPU host and the wheel carry.
//
// Contract:
// - Traits: `using Key = ...;` `static const Key& KeyOf(const T&)`,
//   `static uint64_t Hash(const Key&)`; keys compare with ==.
// - An element's key must not change while it is indexed; at most one element
//   per key (Put replaces). The index does not own its elements.
// - Pointers returned stay valid as long as the elements do; slots move on
//   every Put and Remove (no iterators). Not thread-safe: the owner's lock
//   guards it, as it guards the elements.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace orbitkv {

template <typename T, typename Traits>
class FlatIndex {
 public:
  using Key = typename Traits::Key;

  enum class Shrink { kBelowOneSixteenth, kKeepPeak };
  FlatIndex() = default;
  explicit FlatIndex(Shrink shrink) : shrink_(shrink) {}
  FlatIndex(const FlatIndex&) = delete;
  FlatIndex& operator=(const FlatIndex&) = delete;
  FlatIndex(FlatIndex&&) noexcept = default;
  FlatIndex& operator=(FlatIndex&&) noexcept = default;

  // The element indexed under `key`, or null.
  T* Find(const Key& key) const {
    if (size_ == 0) return nullptr;
    const uint64_t h = Traits::Hash(key);
    for (size_t s = Home(h);; s = Next(s)) {
      const Slot& slot = slots_[s];
      if (slot.item == nullptr) return nullptr;
      if (slot.hash == h && Traits::KeyOf(*slot.item) == key) return slot.item;
    }
  }

  // Hints for a caller that knows its next keys (a chain walk): start loading
  // the slot of `key`, or (its slot loaded, e.g. by a PrefetchSlot a few keys
  // earlier) the element whose hash matches. Neither changes anything.
  void PrefetchSlot(const Key& key) const {
    if (size_ != 0) __builtin_prefetch(&slots_[Home(Traits::Hash(key))]);
  }
  void PrefetchElement(const Key& key) const {
    if (size_ == 0) return;
    const uint64_t h = Traits::Hash(key);
    for (size_t s = Home(h);; s = Next(s)) {
      const Slot& slot = slots_[s];
      if (slot.item == nullptr) return;
      if (slot.hash == h) {
        __builtin_prefetch(slot.item);
        __builtin_prefetch(reinterpret_cast<const char*>(slot.item) + 64);
        return;
      }
    }
  }

  // Indexes `t` under its key; returns the element it displaced (null if none).
  T* Put(T* t) {
    assert(t != nullptr);
    if ((size_ + 1) * 4 > slots_.size() * 3) Rehash(slots_.empty() ? kMinSlots : slots_.size() * 2);
    const Key& key = Traits::KeyOf(*t);
    const uint64_t h = Traits::Hash(key);
    for (size_t s = Home(h);; s = Next(s)) {
      Slot& slot = slots_[s];
      if (slot.item == nullptr) {
        slot = Slot{h, t};
        ++size_;
        return nullptr;
      }
      if (slot.hash == h && Traits::KeyOf(*slot.item) == key) return std::exchange(slot.item, t);
    }
  }

  // Removes `t` if it is the element indexed under its key (another element
  // with the same key stays); returns whether it was.
  bool Remove(const T* t) {
    if (size_ == 0) return false;
    const uint64_t h = Traits::Hash(Traits::KeyOf(*t));
    size_t s = Home(h);
    for (;; s = Next(s)) {
      if (slots_[s].item == nullptr) return false;
      if (slots_[s].item == t) break;
    }
    // Backward shift: pull each later element of the run whose home is not in
    // (hole, j] into the hole, so every lookup still meets its element before
    // an empty slot.
    size_t hole = s;
    for (size_t j = Next(s);; j = Next(j)) {
      Slot& slot = slots_[j];
      if (slot.item == nullptr) break;
      const size_t home = Home(slot.hash);
      const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (stays) continue;
      slots_[hole] = slot;
      hole = j;
    }
    slots_[hole] = Slot{};
    --size_;
    if (shrink_ == Shrink::kBelowOneSixteenth && slots_.size() > kMinSlots &&
        size_ * 16 < slots_.size()) {
      Rehash(slots_.size() / 2);
    }
    return true;
  }

  // Calls f(T*) for every element, in no order. f must not change the index.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& slot : slots_) {
      if (slot.item != nullptr) f(slot.item);
    }
  }

  void Clear() {
    slots_.clear();
    slots_.shrink_to_fit();
    size_ = 0;
    bits_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t slots() const { return slots_.size(); }
  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    uint64_t hash = 0;
    T* item = nullptr;  // null: empty
  };
  static constexpr size_t kMinSlots = 16;

  size_t Home(uint64_t h) const { return (h * 0x9E3779B97F4A7C15ull) >> (64 - bits_); }
  size_t Next(size_t s) const { return (s + 1) & (slots_.size() - 1); }

  void Rehash(size_t n) {
    std::vector<Slot> old(n);
    old.swap(slots_);
    bits_ = 0;
    while ((size_t{1} << bits_) < n) ++bits_;
    for (const Slot& slot : old) {
      if (slot.item == nullptr) continue;
      size_t s = Home(slot.hash);
      while (slots_[s].item != nullptr) s = Next(s);
      slots_[s] = slot;
    }
  }

  Shrink shrink_ = Shrink::kBelowOneSixteenth;
  std::vector<Slot> slots_;  // a power of two, or empty
  unsigned bits_ = 0;        // log2(slots_.size())
  size_t size_ = 0;
};

}  // namespace orbitkv
