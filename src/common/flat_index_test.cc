#include "common/flat_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

namespace orbitkv {
namespace {

struct Item {
  uint64_t key = 0;
  int version = 0;
};

// Traits with the key as its own hash: sequential keys, the index's own mix spreads them.
struct ByKey {
  using Key = uint64_t;
  static const Key& KeyOf(const Item& i) { return i.key; }
  static uint64_t Hash(const Key& k) { return k; }
};
// Every key in a handful of homes: long runs that wrap, where backward-shift
// deletion is easiest to get wrong.
struct Clustered {
  using Key = uint64_t;
  static const Key& KeyOf(const Item& i) { return i.key; }
  static uint64_t Hash(const Key& k) { return k % 3; }
};

TEST(FlatIndexTest, FindPutRemove) {
  FlatIndex<Item, ByKey> index;
  EXPECT_EQ(index.Find(7), nullptr);
  Item a{7, 0}, b{8, 0}, a2{7, 1};
  EXPECT_EQ(index.Put(&a), nullptr);
  EXPECT_EQ(index.Put(&b), nullptr);
  EXPECT_EQ(index.Find(7), &a);
  EXPECT_EQ(index.Find(8), &b);
  EXPECT_EQ(index.size(), 2u);
  // Put of another element under a present key replaces it and returns it.
  EXPECT_EQ(index.Put(&a2), &a);
  EXPECT_EQ(index.Find(7), &a2);
  EXPECT_EQ(index.size(), 2u);
  // Remove names an element, not a key: the displaced one is not indexed.
  EXPECT_FALSE(index.Remove(&a));
  EXPECT_EQ(index.Find(7), &a2);
  EXPECT_TRUE(index.Remove(&a2));
  EXPECT_FALSE(index.Remove(&a2));
  EXPECT_EQ(index.Find(7), nullptr);
  EXPECT_EQ(index.Find(8), &b);
  EXPECT_EQ(index.size(), 1u);
}

// Random puts, replaces and removes against std::unordered_map, with growth
// and shrinking; every key is checked after every step of the clustered run.
template <typename Traits>
void RunAgainstModel(uint64_t key_space, int steps, bool check_all) {
  std::mt19937_64 rng(42);
  std::vector<std::unique_ptr<Item>> owned;
  std::unordered_map<uint64_t, Item*> model;
  FlatIndex<Item, Traits> index;
  for (int step = 0; step < steps; ++step) {
    const uint64_t k = rng() % key_space;
    const unsigned op = rng() % 10;
    if (op < 6) {
      owned.push_back(std::make_unique<Item>(Item{k, step}));
      Item* displaced = index.Put(owned.back().get());
      auto it = model.find(k);
      ASSERT_EQ(displaced, it == model.end() ? nullptr : it->second) << "step " << step;
      model[k] = owned.back().get();
    } else {
      auto it = model.find(k);
      if (it == model.end()) continue;
      ASSERT_TRUE(index.Remove(it->second)) << "step " << step;
      model.erase(it);
    }
    ASSERT_EQ(index.size(), model.size());
    if (check_all || step % 1000 == 0) {
      for (uint64_t q = 0; q < key_space; ++q) {
        auto it = model.find(q);
        ASSERT_EQ(index.Find(q), it == model.end() ? nullptr : it->second)
            << "key " << q << " after step " << step;
      }
    }
  }
  size_t seen = 0;
  index.ForEach([&](Item* i) {
    ++seen;
    EXPECT_EQ(model.at(i->key), i);
  });
  EXPECT_EQ(seen, model.size());
  // Drained, it shrinks back.
  for (auto& [k, item] : model) ASSERT_TRUE(index.Remove(item));
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.slots(), 16u);
}

TEST(FlatIndexTest, MatchesAMapUnderRandomPutsAndRemoves) {
  RunAgainstModel<ByKey>(/*key_space=*/20000, /*steps=*/200000, /*check_all=*/false);
}

TEST(FlatIndexTest, BackwardShiftKeepsWrappedClustersFindable) {
  RunAgainstModel<Clustered>(/*key_space=*/200, /*steps=*/20000, /*check_all=*/true);
}

TEST(FlatIndexTest, StaysAtMostThreeQuartersFull) {
  FlatIndex<Item, ByKey> index;
  std::vector<Item> items(100000);
  for (uint64_t i = 0; i < items.size(); ++i) {
    items[i].key = i;
    index.Put(&items[i]);
    ASSERT_LE(index.size() * 4, index.slots() * 3);
  }
  EXPECT_LE(index.memory_bytes(), items.size() * 43);
  for (uint64_t i = 0; i < items.size(); ++i) ASSERT_EQ(index.Find(i), &items[i]);
  index.Clear();
  EXPECT_EQ(index.Find(5), nullptr);
  EXPECT_EQ(index.memory_bytes(), 0u);
}

// A query's leases fill the catalog's lease index and its release empties it:
// made with kKeepPeak, the index keeps its slots through the cycle (no
// rehash on the way down or back up) and still finds and forgets exactly;
// the default halves below 1/16 full.
TEST(FlatIndexTest, KeepPeakKeepsItsSlotsWhenEmptiedAndTheDefaultShrinks) {
  using Index = FlatIndex<Item, ByKey>;
  Index peak(Index::Shrink::kKeepPeak);
  Index shrinking;
  std::vector<Item> items(4096);
  for (int cycle = 0; cycle < 3; ++cycle) {
    for (uint64_t i = 0; i < items.size(); ++i) {
      items[i].key = i + 100000 * static_cast<uint64_t>(cycle);
      peak.Put(&items[i]);
      shrinking.Put(&items[i]);
    }
    const size_t full = peak.slots();
    EXPECT_EQ(shrinking.slots(), full);
    for (uint64_t i = 0; i < items.size(); ++i) {
      ASSERT_EQ(peak.Find(items[i].key), &items[i]);
      ASSERT_TRUE(peak.Remove(&items[i]));
      ASSERT_EQ(peak.Find(items[i].key), nullptr);
      ASSERT_TRUE(shrinking.Remove(&items[i]));
    }
    EXPECT_EQ(peak.size(), 0u);
    EXPECT_EQ(peak.slots(), full) << "cycle " << cycle;
    EXPECT_EQ(shrinking.slots(), 16u);
  }
  peak.Clear();
  EXPECT_EQ(peak.memory_bytes(), 0u);
}

}  // namespace
}  // namespace orbitkv
