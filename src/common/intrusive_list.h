// IntrusiveList: a doubly linked list threaded through a ListHook member of
// its elements, so linking and unlinking allocate nothing and an element
// leaves the list in O(1) from a pointer to it.
//
// Contract:
// - An element is in at most one list per hook; PushBack of a linked element
//   and Remove of an element of another list are bugs (asserted).
// - Remove of an unlinked element is a no-op, so callers need no flag of their own.
// - The list does not own its elements: an element must be removed before it
//   is destroyed. Not thread-safe: the owner's lock guards the list and the hooks.
#pragma once

#include <cassert>
#include <cstddef>

namespace orbitkv {

template <typename T>
struct ListHook {
  T* prev = nullptr;
  T* next = nullptr;
  bool linked = false;
};

template <typename T, ListHook<T> T::*Hook>
class IntrusiveList {
 public:
  IntrusiveList() = default;
  IntrusiveList(const IntrusiveList&) = delete;
  IntrusiveList& operator=(const IntrusiveList&) = delete;

  bool empty() const { return head_ == nullptr; }
  size_t size() const { return size_; }
  T* front() const { return head_; }
  T* back() const { return tail_; }
  static bool Linked(const T& e) { return (e.*Hook).linked; }
  static T* Next(const T& e) { return (e.*Hook).next; }

  void PushBack(T& e) {
    ListHook<T>& h = e.*Hook;
    assert(!h.linked);
    h.prev = tail_;
    h.next = nullptr;
    (tail_ ? (tail_->*Hook).next : head_) = &e;
    tail_ = &e;
    h.linked = true;
    ++size_;
  }

  void Remove(T& e) {
    ListHook<T>& h = e.*Hook;
    if (!h.linked) return;
    assert(size_ > 0);
    (h.prev ? (h.prev->*Hook).next : head_) = h.next;
    (h.next ? (h.next->*Hook).prev : tail_) = h.prev;
    h = ListHook<T>{};
    --size_;
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
  size_t size_ = 0;
};

}  // namespace orbitkv
