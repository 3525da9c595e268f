// Storage codecs through the Manager (issue 17): selection at register, the
// namespace identity, round trips per codec from DRAM and from SSD (after
// DRAM eviction, re-registration and a Manager restart), and damaged encoded
// objects on disk as per-block Corruption.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>

#include <gtest/gtest.h>

#include "codec/codec.h"
#include "manager/manager_test_fixture.h"

namespace orbitkv {
namespace {

constexpr uint64_t kSlot = 65536;  // 256 head vectors of 128 bf16
constexpr uint64_t kPages = 64;

StorageCodecRequest Codec(std::string name, uint32_t head_dim = 128, std::string dtype = "bf16") {
  return {std::move(name), std::move(dtype), head_dim};
}

uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);  // round to nearest even
}

float FromBf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// KV-like bf16: Gaussian values with a per-head-vector scale, seeded.
void FillKv(uint8_t* p, uint64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto* v = reinterpret_cast<uint16_t*>(p);
  float scale = 1;
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    if (i % 128 == 0) scale = 0.05f + float(rng() % 1000) / 250.0f;
    v[i] = Bf16(n(rng) * scale);
  }
}

// Every kind of bf16 bit pattern a lossless codec must keep: NaNs with
// payloads, infinities, denormals, signed zeros, then all 65536 patterns.
void FillSpecial(uint8_t* p, uint64_t bytes) {
  auto* v = reinterpret_cast<uint16_t*>(p);
  const uint16_t special[] = {0x7fc0, 0xffc0, 0x7f81, 0xffff, 0x7f80, 0xff80,
                              0x0001, 0x8001, 0x007f, 0x0000, 0x8000, 0x3f80};
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    v[i] = i < 4096 ? special[i % std::size(special)] : static_cast<uint16_t>(i * 40503u);
  }
}

// sum |x - y|^2 / sum |x|^2 over bf16 values.
double RelativeMse(const uint8_t* want, const uint8_t* got, uint64_t bytes) {
  const auto* a = reinterpret_cast<const uint16_t*>(want);
  const auto* b = reinterpret_cast<const uint16_t*>(got);
  double err = 0, norm = 0;
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    const double x = FromBf16(a[i]), y = FromBf16(b[i]);
    err += (x - y) * (x - y);
    norm += x * x;
  }
  return err / norm;
}

class ManagerCodecTest : public ManagerTest {
 protected:
  InstanceLayout layout = SplitLayout(kPages, {kSlot, kSlot});
  HostPages pages{layout};
  std::vector<std::vector<uint8_t>> published{kPages};  // what page p held at its publish

  Result<InstanceId> TryRegister(const StorageCodecRequest& codec, std::string ns = "model-a",
                                 const InstanceLayout* l = nullptr, HostPages* p = nullptr) {
    RegisterRequest r;
    r.ns = std::move(ns);
    r.layout = l ? *l : layout;
    r.storage = codec;
    return mgr->RegisterInstance(session, r, (p ? *p : pages).DupFds());
  }
  InstanceId RegisterWith(const StorageCodecRequest& codec, std::string ns = "model-a") {
    Result<InstanceId> id = TryRegister(codec, std::move(ns));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }

  std::vector<uint8_t> PageBytes(uint64_t page) {
    std::vector<uint8_t> out;
    for (size_t s = 0; s < 2; ++s) {
      const uint8_t* p = pages.Slot(0, s, page);
      out.insert(out.end(), p, p + kSlot);
    }
    return out;
  }

  // Publishes key k from page k (filled by `fill`), writing each back before
  // the next; the small pool then holds only the last few in DRAM.
  void PublishAll(InstanceId inst, uint64_t n,
                  const std::function<void(uint8_t*, uint64_t, uint64_t)>& fill) {
    for (uint64_t k = 0; k < n; ++k) {
      for (size_t s = 0; s < 2; ++s) fill(pages.Slot(0, s, k), kSlot, k * 2 + s);
      published[k] = PageBytes(k);
      Publish(inst, {k}, {k});
      mgr->Drain();
    }
  }

  // Restores key `key` into page `page` from tier `from`; returns its status.
  Status RestoreInto(InstanceId inst, uint64_t key, uint64_t page, Tier from) {
    for (size_t s = 0; s < 2; ++s) std::memset(pages.Slot(0, s, page), 0x77, kSlot);
    QueryResult q = Query(inst, {key});
    if (q.prefix != 1) return Status::NotFound("key " + std::to_string(key) + " missed");
    EXPECT_EQ(q.sources[0], from) << "key " << key;
    RestoreResult r = Restore(inst, q.query, {0}, {page});
    return r.blocks.empty() ? Status::Internal("no block") : r.blocks[0].status;
  }

  bool PageUntouched(uint64_t page) {
    std::vector<uint8_t> b = PageBytes(page);
    return std::all_of(b.begin(), b.end(), [](uint8_t c) { return c == 0x77; });
  }

  double Metric(const char* name, const std::string& codec, const char* op = nullptr) {
    Labels l = {{"codec", codec}};
    if (op) l.push_back({"op", op});
    return metrics.Read(name, l);
  }

  // The header of key `key`'s object on disk, parsed; and where it lies.
  struct OnDisk {
    std::string path;
    uint64_t offset = 0;
    ParsedHeader header;
  };
  // With `codec`: only an object of that codec (keys repeat across namespaces).
  OnDisk Find(uint64_t key, std::optional<codec::CodecId> want = std::nullopt);
};

// Where key v's object starts in the shard files (its header's magic and key).
ManagerCodecTest::OnDisk ManagerCodecTest::Find(uint64_t v, std::optional<codec::CodecId> want) {
  const BlockKey key = K(v);
  for (const std::string& path : ShardPaths(dir.File("cache.bin"), 2)) {
    std::ifstream in(path, std::ios::binary);
    std::string file{std::istreambuf_iterator<char>(in), {}};
    for (uint64_t off = kShardHeaderSize; off + 1024 <= file.size(); off += 4096) {
      if (std::memcmp(file.data() + off, kObjectMagic, sizeof kObjectMagic) != 0 ||
          std::memcmp(file.data() + off + 32, key.data(), key.size()) != 0) {
        continue;
      }
      auto h = ParseObjectHeader({reinterpret_cast<const uint8_t*>(file.data()) + off, 1024},
                                 file.size() - off);
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (h.ok() && want && h->codec != static_cast<uint8_t>(*want)) continue;
      return {path, off, h.ok() ? *h : ParsedHeader{}};
    }
  }
  ADD_FAILURE() << "key " << v << " is not on disk";
  return {};
}

void XorByte(const std::string& path, uint64_t at, uint8_t mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

// Recomputes the header CRC of the object at `offset`, so a damaged field
// behind it is what a reader meets.
void ResealOnDisk(const std::string& path, uint64_t offset, uint64_t header_bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<uint8_t> h(header_bytes);
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(h.size()));
  SealObjectHeader(h);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(h.data()), static_cast<std::streamsize>(h.size()));
}

// ---- selection --------------------------------------------------------------

TEST_F(ManagerCodecTest, UnknownOrIncompleteCodecRequestsAreRefusedClearly) {
  Start(8u << 20);
  auto refused = [&](const StorageCodecRequest& c, const std::string& says) {
    Result<InstanceId> id = TryRegister(c);
    ASSERT_FALSE(id.ok()) << c.codec;
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(says), std::string_view::npos) << id.status().ToString();
  };
  refused(Codec("zstd"), "unknown storage codec 'zstd'");
  refused(Codec("fp8", 0), "fp8 is lossy: it needs the KV element dtype and head_dim");
  refused(Codec("turboquant-4", 128, ""), "needs the KV element dtype and head_dim");
  refused(Codec("turboquant-3", 100), "does not take dtype bf16, head_dim 100");
  refused(Codec("ans", 0, "int4"), "unknown element dtype 'int4'");
  refused(Codec("fp8", 48), "is not a whole number of head vectors of 48 bf16 elements");
  InstanceLayout odd = SplitLayout(4, {1001});
  HostPages odd_pages(odd);
  Result<InstanceId> o = TryRegister(Codec("ans", 0), "odd", &odd, &odd_pages);
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << o.status().ToString();
  // ans without a dtype takes 2-byte elements; "none" needs nothing.
  EXPECT_TRUE(TryRegister(Codec("ans", 0, "")).ok());
  EXPECT_TRUE(TryRegister(Codec("none", 0, "")).ok());
  ExpectAllReleased();
}

TEST_F(ManagerCodecTest, ManagerDefaultCodecIsValidatedAndAppliesToPlainRegisters) {
  ManagerConfig bad = Config(8u << 20);
  bad.options.storage_codec = "lz4";
  Result<std::unique_ptr<Manager>> m = Manager::Create(bad);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("--storage-codec"), std::string_view::npos);

  ManagerConfig c = Config(1u << 20);
  c.options.storage_codec = "fp8";
  mgr = std::move(Manager::Create(c)).value();
  session = mgr->OpenSession(getpid());
  // A lossy default needs the engine's dtype and head_dim; an engine may opt out.
  Result<InstanceId> plain = TryRegister({});
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.status().message().find("--storage-codec"), std::string_view::npos);
  EXPECT_TRUE(TryRegister(Codec("none", 0, ""), "opted-out").ok());
  InstanceId inst = RegisterWith({"", "bf16", 128});
  PublishAll(inst, 20, FillKv);
  EXPECT_EQ(Find(0).header.codec, static_cast<uint8_t>(codec::CodecId::kFp8));
}

// ---- round trips ---------------------------------------------------------------

// ans: bit-exact from DRAM (the raw published copy), from SSD after eviction
// (the encoded object), from DRAM again (the encoded copy promoted by that
// restore), and after re-registration; NaN payloads, infinities, denormals,
// zero pages and incompressible bytes included.
TEST_F(ManagerCodecTest, AnsRoundTripsBitExactFromDramAndSsd) {
  Start(1u << 20);
  InstanceId inst = RegisterWith(Codec("ans", 0));
  auto fill = [](uint8_t* p, uint64_t n, uint64_t seed) {
    switch (seed % 4) {
      case 0:
        return FillKv(p, n, seed);
      case 1:
        return FillSpecial(p, n);
      case 2:
        return std::memset(p, 0, n), void();
      default:
        for (uint64_t i = 0; i < n; ++i) p[i] = HostPages::Byte(seed, 0, i);
    }
  };
  PublishAll(inst, 24, fill);
  // Key 23 is still in DRAM (raw); key 0..3 only on SSD, encoded.
  ASSERT_TRUE(RestoreInto(inst, 23, 60, Tier::kDram).ok());
  EXPECT_EQ(PageBytes(60), published[23]);
  for (uint64_t k = 0; k < 4; ++k) {
    const OnDisk d = Find(k);
    EXPECT_EQ(d.header.codec, static_cast<uint8_t>(codec::CodecId::kAns));
    EXPECT_EQ(d.header.codec_version, codec::kAnsFormatVersion);
    Status st = RestoreInto(inst, k, 60 + k % 2, Tier::kSsd);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(PageBytes(60 + k % 2), published[k]) << "key " << k;
  }
  // All-zero and KV pages shrink (key 1 slot 0: zeros; key 0 slot 0: KV);
  // the promoted DRAM copy is the encoded one.
  EXPECT_LT(Find(1).header.segments[0].size, kSlot / 8);
  EXPECT_LT(Find(0).header.segments[0].size, kSlot * 9 / 10);
  ASSERT_TRUE(RestoreInto(inst, 1, 62, Tier::kDram).ok());
  EXPECT_EQ(PageBytes(62), published[1]);
  // Re-registration: the namespace (and its codec) keeps its objects.
  mgr->CloseSession(session);
  session = mgr->OpenSession(getpid());
  inst = RegisterWith(Codec("ans", 0));
  ASSERT_TRUE(RestoreInto(inst, 5, 63, Tier::kSsd).ok());
  EXPECT_EQ(PageBytes(63), published[5]);
  EXPECT_GT(Metric("orbitkv_codec_bytes_in_total", "ans", "encode"), 24.0 * 2 * kSlot - 1);
  EXPECT_GT(Metric("orbitkv_codec_bytes_out_total", "ans", "decode"), 0);
  EXPECT_LT(Metric("orbitkv_codec_bytes_out_total", "ans", "encode"),
            Metric("orbitkv_codec_bytes_in_total", "ans", "encode"));
  EXPECT_EQ(Metric("orbitkv_codec_failures_total", "ans", "decode"), 0);
  ExpectAllReleased();
}

// The lossy codecs: within each codec's documented error (README "Storage
// codecs": fp8 relative MSE 2.8e-4, TurboQuant D_mse 0.0094 / 0.034) from SSD;
// the DRAM copy of a fresh publish stays exact.
TEST_F(ManagerCodecTest, LossyCodecsRoundTripWithinTheirErrorFromSsd) {
  const std::pair<const char*, double> cases[] = {
      {"fp8", 1e-3}, {"turboquant-4", 0.015}, {"turboquant-3", 0.045}};
  Start(1u << 20);
  for (auto [name, bound] : cases) {
    SCOPED_TRACE(name);
    const std::string ns = std::string("lossy-") + name;
    InstanceId inst = RegisterWith(Codec(name), ns);
    PublishAll(inst, 20, FillKv);
    ASSERT_TRUE(RestoreInto(inst, 19, 60, Tier::kDram).ok());
    EXPECT_EQ(PageBytes(60), published[19]);
    for (uint64_t k : {0, 1}) {
      Status st = RestoreInto(inst, k, 61, Tier::kSsd);
      ASSERT_TRUE(st.ok()) << st.ToString();
      const std::vector<uint8_t> got = PageBytes(61);
      const double mse = RelativeMse(published[k].data(), got.data(), got.size());
      EXPECT_LT(mse, bound) << "key " << k;
      EXPECT_GT(mse, 0.0) << "a lossy codec returned exact bytes: was it encoded at all?";
    }
    EXPECT_LT(Find(0, *codec::ParseCodecName(name)).header.segments[0].size, kSlot * 6 / 10);
    EXPECT_GT(Metric("orbitkv_codec_bytes_in_total", name, "decode"), 0);
    ASSERT_TRUE(mgr->UnregisterInstance(session, inst).ok());
  }
  ExpectAllReleased();
}

// --codec-dram-copy encoded: once written back, the encoded object replaces
// the raw DRAM entry (counted, smaller), and DRAM restores into host pages
// decode it on the CPU: ans gives the published bytes, fp8 the SSD copy's
// bytes (the same as a restore from SSD). Without the flag the raw copy stays.
TEST_F(ManagerCodecTest, EncodedDramCopiesReplaceRawOnesAfterWriteback) {
  ManagerConfig c = Config(8u << 20);
  c.options.codec_dram_copy_encoded = true;
  mgr = std::move(Manager::Create(c)).value();
  session = mgr->OpenSession(getpid());
  InstanceId ans = RegisterWith(Codec("ans", 0), "dram-ans");
  PublishAll(ans, 4, FillKv);
  EXPECT_EQ(Metric("orbitkv_codec_dram_copies_total", "ans"), 4);
  EXPECT_GT(Metric("orbitkv_codec_dram_bytes_saved_total", "ans"), 0);
  const double decoded = Metric("orbitkv_codec_bytes_out_total", "ans", "decode");
  for (uint64_t k = 0; k < 4; ++k) {
    ASSERT_TRUE(RestoreInto(ans, k, 60, Tier::kDram).ok());
    EXPECT_EQ(PageBytes(60), published[k]) << "key " << k;
  }
  EXPECT_EQ(Metric("orbitkv_codec_bytes_out_total", "ans", "decode"), decoded + 4.0 * 2 * kSlot);
  InstanceId fp8 = RegisterWith(Codec("fp8"), "dram-fp8");
  PublishAll(fp8, 2, FillKv);
  EXPECT_EQ(Metric("orbitkv_codec_dram_copies_total", "fp8"), 2);
  ASSERT_TRUE(RestoreInto(fp8, 0, 60, Tier::kDram).ok());
  const std::vector<uint8_t> from_dram = PageBytes(60);
  EXPECT_NE(from_dram, published[0]) << "a lossy DRAM copy gave the raw bytes";
  EXPECT_LT(RelativeMse(published[0].data(), from_dram.data(), from_dram.size()), 1e-3);
  // The same bytes as the SSD copy: its frames decoded on the CPU.
  const OnDisk d = Find(0, codec::CodecId::kFp8);
  std::ifstream in(d.path, std::ios::binary);
  std::string file{std::istreambuf_iterator<char>(in), {}};
  std::vector<uint8_t> want;
  for (size_t sl = 0; sl < 2; ++sl) {
    const SegmentPos& seg = d.header.segments[sl];
    std::vector<uint8_t> out(kSlot);
    ASSERT_TRUE(
        codec::Decode(
            {reinterpret_cast<const uint8_t*>(file.data()) + d.offset + seg.offset, seg.size}, out)
            .ok());
    want.insert(want.end(), out.begin(), out.end());
  }
  EXPECT_EQ(from_dram, want);
  ExpectAllReleased();
}

// --codec-budget bounds what a writeback lane holds encoded: with a budget
// below one object each is written on its own, and every buffer is returned.
TEST_F(ManagerCodecTest, TinyCodecBudgetWritesEachObjectAloneAndReturnsItsBuffers) {
  ManagerConfig c = Config(8u << 20);
  c.options.codec_budget = 1;
  mgr = std::move(Manager::Create(c)).value();
  session = mgr->OpenSession(getpid());
  InstanceId inst = RegisterWith(Codec("turboquant-4"));
  std::vector<uint64_t> keys, pgs;
  for (uint64_t k = 0; k < 8; ++k) {
    for (size_t s = 0; s < 2; ++s) FillKv(pages.Slot(0, s, k), kSlot, 40 + k * 2 + s);
    keys.push_back(k);
    pgs.push_back(k);
  }
  EXPECT_EQ(Publish(inst, keys, pgs).sealed, 8u);  // queued together, batched by the lane
  mgr->Drain();
  EXPECT_EQ(metrics.Read("orbitkv_ssd_objects_written_total"), 8);
  EXPECT_EQ(metrics.Read("orbitkv_codec_budget_used_bytes"), 0);
  for (uint64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(Find(k).header.codec, static_cast<uint8_t>(codec::CodecId::kTurboQuant4));
  }
  ExpectAllReleased();
}

// A restarted Manager recreates its SSD cache: every key misses (never stale
// or foreign bytes), and the codec path works on the fresh cache.
TEST_F(ManagerCodecTest, AfterAManagerRestartKeysMissThenRoundTripAgain) {
  Start(1u << 20);
  InstanceId inst = RegisterWith(Codec("ans", 0));
  PublishAll(inst, 20, FillKv);
  mgr.reset();
  Start(1u << 20);
  inst = RegisterWith(Codec("ans", 0));
  EXPECT_EQ(Query(inst, {0}).prefix, 0u);
  PublishAll(inst, 20, FillKv);
  ASSERT_TRUE(RestoreInto(inst, 0, 60, Tier::kSsd).ok());
  EXPECT_EQ(PageBytes(60), published[0]);
  ExpectAllReleased();
}

// The codec is part of the namespace: the same name under another codec (or
// other codec parameters) neither sees nor skips the other's objects.
TEST_F(ManagerCodecTest, NamespacesOfDifferentCodecsDoNotShareObjects) {
  Start(8u << 20);
  InstanceId ans = RegisterWith(Codec("ans", 0));
  InstanceId none = RegisterWith({});
  InstanceId fp8_128 = RegisterWith(Codec("fp8", 128));
  InstanceId fp8_64 = RegisterWith(Codec("fp8", 64));
  pages.Fill(0, 0, 5);
  Publish(ans, {1}, {0});
  mgr->Drain();
  EXPECT_EQ(Query(ans, {1}).prefix, 1u);
  EXPECT_EQ(Query(none, {1}).prefix, 0u);
  EXPECT_EQ(Query(fp8_128, {1}).prefix, 0u);
  PublishResult p = Publish(fp8_128, {1}, {0});
  EXPECT_EQ(p.skipped, 0u) << "another codec's object made the publish skip";
  EXPECT_EQ(p.sealed, 1u);
  EXPECT_EQ(Query(fp8_64, {1}).prefix, 0u);
  // Same codec and parameters: shared.
  InstanceId ans2 = RegisterWith(Codec("ans", 0, "bf16"));
  EXPECT_EQ(Query(ans2, {1}).prefix, 1u);
  mgr->CloseSession(session);
  session = mgr->OpenSession(getpid());
  ExpectAllReleased();
}

// ---- corruption -------------------------------------------------------------------

// One flipped bit in an encoded object on disk: in the payload, in a segment's
// CRC, in a segment's size (each also with the header CRC resealed, so the
// per-segment checks are what catch it). Each is a per-block Corruption, the
// page is untouched, the object leaves the SSD cache and the key can be stored
// again; payload damage counts on orbitkv_codec_crc_failures_total.
TEST_F(ManagerCodecTest, AFlippedBitInAnEncodedObjectIsCorruptionNotWrongBytes) {
  Start(1u << 20);
  InstanceId inst = RegisterWith(Codec("ans", 0));
  PublishAll(inst, 24, FillKv);
  struct Damage {
    const char* what;
    uint64_t key;
    bool reseal;
  };
  const Damage cases[] = {
      {"payload", 0, false},      {"segment CRC", 1, false}, {"segment CRC", 2, true},
      {"segment size", 3, false}, {"segment size", 4, true},
  };
  for (const Damage& d : cases) {
    const double crc_failures = Metric("orbitkv_codec_crc_failures_total", "ans");
    SCOPED_TRACE(std::string(d.what) + (d.reseal ? ", header resealed" : ""));
    const OnDisk o = Find(d.key);
    const uint64_t entry = o.offset + kObjectHeaderFixedBytes + kObjectSlotEntryBytes;  // slot 1
    if (std::string(d.what) == "payload") {
      XorByte(o.path, o.offset + o.header.segments[1].offset + 777, 0x10);
    } else if (std::string(d.what) == "segment CRC") {
      XorByte(o.path, entry + 16, 0x01);
    } else {
      XorByte(o.path, entry + 8, 0x02);  // size: +-2 bytes
    }
    if (d.reseal) ResealOnDisk(o.path, o.offset, o.header.header_size);
    Status st = RestoreInto(inst, d.key, 60, Tier::kSsd);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_TRUE(PageUntouched(60)) << "bytes reached the page";
    EXPECT_EQ(Query(inst, {d.key}).prefix, 0u) << "the damaged object is still served";
    // The header CRC catches an unresealed table entry; behind a resealed one
    // the segment CRC does (a size past the object fails the header's bounds).
    const double counted = Metric("orbitkv_codec_crc_failures_total", "ans") - crc_failures;
    const bool payload_check =
        std::string(d.what) == "payload" || (d.reseal && std::string(d.what) == "segment CRC");
    if (payload_check) EXPECT_EQ(counted, 1);
    if (!d.reseal && !payload_check) EXPECT_EQ(counted, 0);
  }
  EXPECT_EQ(metrics.Read("orbitkv_ssd_corrupt_objects_dropped_total"), 5);
  EXPECT_GT(metrics.Read("orbitkv_restore_blocks_total", {{"outcome", "error"}}), 4);
  // Stored again, a damaged key restores exactly.
  for (size_t s = 0; s < 2; ++s) FillKv(pages.Slot(0, s, 0), kSlot, 99 + s);
  published[0] = PageBytes(0);
  EXPECT_EQ(Publish(inst, {0}, {0}).sealed, 1u);
  mgr->Drain();
  ASSERT_TRUE(RestoreInto(inst, 0, 61, Tier::kDram).ok());
  EXPECT_EQ(PageBytes(61), published[0]);
  ExpectAllReleased();
}

}  // namespace
}  // namespace orbitkv
