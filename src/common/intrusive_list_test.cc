#include "common/intrusive_list.h"

#include <gtest/gtest.h>

#include <vector>

namespace orbitkv {
namespace {

struct Node {
  int value = 0;
  ListHook<Node> a;
  ListHook<Node> b;
};
using ListA = IntrusiveList<Node, &Node::a>;
using ListB = IntrusiveList<Node, &Node::b>;

std::vector<int> Values(const ListA& l) {
  std::vector<int> out;
  for (Node* n = l.front(); n != nullptr; n = ListA::Next(*n)) out.push_back(n->value);
  return out;
}

TEST(IntrusiveListTest, PushRemoveKeepOrderAndLinks) {
  Node n[4];
  for (int i = 0; i < 4; ++i) n[i].value = i;
  ListA l;
  EXPECT_TRUE(l.empty());
  for (Node& x : n) l.PushBack(x);
  EXPECT_EQ(Values(l), (std::vector<int>{0, 1, 2, 3}));
  l.Remove(n[0]);  // head
  l.Remove(n[2]);  // middle
  l.Remove(n[3]);  // tail
  EXPECT_EQ(Values(l), (std::vector<int>{1}));
  EXPECT_EQ(l.front(), &n[1]);
  EXPECT_EQ(l.back(), &n[1]);
  EXPECT_FALSE(ListA::Linked(n[0]));
  l.Remove(n[0]);  // unlinked: a no-op
  EXPECT_EQ(l.size(), 1u);
  l.PushBack(n[0]);  // back in, at the tail
  EXPECT_EQ(Values(l), (std::vector<int>{1, 0}));
  l.Remove(n[1]);
  l.Remove(n[0]);
  EXPECT_TRUE(l.empty());
  EXPECT_EQ(l.back(), nullptr);
}

TEST(IntrusiveListTest, TwoHooksAreIndependentLists) {
  Node n[3];
  ListA a;
  ListB b;
  for (Node& x : n) a.PushBack(x);
  b.PushBack(n[2]);
  b.PushBack(n[0]);
  a.Remove(n[0]);
  EXPECT_TRUE(ListB::Linked(n[0]));
  EXPECT_EQ(b.front(), &n[2]);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(a.size(), 2u);
  b.Remove(n[2]);
  b.Remove(n[0]);
  a.Remove(n[1]);
  a.Remove(n[2]);
}

}  // namespace
}  // namespace orbitkv
