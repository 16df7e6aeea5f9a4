// The block KV cache: growth by blocks, the memory limit, and forking by
// block table with copy-on-write of a shared block (what beam search relies on).
#include "coordinator/engine/kv_cache.h"
#include "tests/status_testlib.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tandem {
namespace {

std::unique_ptr<KvBlockPool> MakePool(int64_t max_blocks) {
  auto pool = KvBlockPool::Create({.num_layers = 2, .kv_dim = 4, .block_size = 4, .max_blocks = max_blocks});
  EXPECT_OK(pool);
  return std::move(*pool);
}

// Writes a recognisable value into every row of positions [from, to).
void Fill(SequenceKv& kv, int64_t from, int64_t to, float base) {
  for (int64_t p = from; p < to; ++p) {
    for (int64_t l = 0; l < 2; ++l) {
      for (int64_t c = 0; c < 4; ++c) {
        kv.KeyRow(l, p)[c] = base + static_cast<float>(p * 10 + l);
        kv.ValueRow(l, p)[c] = -(base + static_cast<float>(p * 10 + l));
      }
    }
  }
}

// The storage's contract: every chunk zero-filled, whatever its size, and
// chunks of 1 MiB or more on 2 MiB boundaries (where transparent huge pages
// can back them); a non-positive size is refused.
TEST(HostKvBlockStorageTest, ChunksAreZeroFilledAndLargeOnesHugePageAligned) {
  HostKvBlockStorage storage;
  for (const int64_t bytes : {int64_t{256}, int64_t{3} << 20}) {
    absl::StatusOr<float*> chunk = storage.AllocateChunk(bytes);
    ASSERT_OK(chunk);
    const float* data = *chunk;
    for (int64_t i = 0; i < bytes / static_cast<int64_t>(sizeof(float)); ++i)
      ASSERT_EQ(data[i], 0.0f) << bytes << " @ " << i;
    if (bytes >= (int64_t{1} << 20)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % (uintptr_t{2} << 20), 0u);
    }
    std::fill_n(*chunk, bytes / static_cast<int64_t>(sizeof(float)), 7.0f);  // the next chunk must not see this
  }
  EXPECT_EQ(storage.AllocateChunk(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, RejectsNonPositiveOptions) {
  const auto pool = KvBlockPool::Create({.num_layers = 2, .kv_dim = 0, .block_size = 4, .max_blocks = 8});
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
}

// DeepSeek's latent cache: one key row per position and layer (the latent
// and the rope key), no value rows; a block is L x B key rows and nothing
// else, rows of different layers and positions never overlap, and a fork's
// copy-on-write copies them.
TEST(KvCacheTest, KeyRowsOnlyWhenValueDimIsZero) {
  auto pool = KvBlockPool::Create({.num_layers = 3, .kv_dim = 576, .value_dim = 0, .block_size = 4, .max_blocks = 4});
  ASSERT_OK(pool);
  EXPECT_EQ((*pool)->bytes_per_block(), 3 * 4 * 576 * 4);
  SequenceKv kv(pool->get());
  ASSERT_OK(kv.Reserve(8));
  kv.set_length(8);
  for (int64_t l = 0; l < 3; ++l)
    for (int64_t p = 0; p < 8; ++p) std::fill_n(kv.KeyRow(l, p), 576, static_cast<float>(l * 100 + p));
  for (int64_t l = 0; l < 3; ++l) {
    std::vector<const float*> rows;
    kv.AppendKeyRows(l, 8, rows);
    ASSERT_EQ(rows.size(), 8u);
    for (int64_t p = 0; p < 8; ++p) {
      EXPECT_EQ(rows[static_cast<size_t>(p)][0], static_cast<float>(l * 100 + p));
      EXPECT_EQ(rows[static_cast<size_t>(p)][575], static_cast<float>(l * 100 + p));
    }
  }
  SequenceKv fork(pool->get());
  fork.ForkFrom(kv);
  fork.set_length(7);
  ASSERT_OK(fork.Reserve(8));  // position 7's block is shared: rewriting it copies it
  std::fill_n(fork.KeyRow(2, 7), 576, -1.0f);
  EXPECT_EQ(kv.KeyRow(2, 7)[0], 207.0f);
  EXPECT_EQ(fork.KeyRow(1, 6)[575], 106.0f);
  EXPECT_EQ(KvBlockPool::Create({.num_layers = 1, .kv_dim = 4, .value_dim = -2, .block_size = 4, .max_blocks = 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, GrowsByBlocksAndStopsAtTheLimit) {
  auto pool = MakePool(3);
  SequenceKv kv(pool.get());
  ASSERT_OK(kv.Reserve(5));
  EXPECT_EQ(pool->blocks_in_use(), 2);
  ASSERT_OK(kv.Reserve(12));
  EXPECT_EQ(pool->blocks_in_use(), 3);
  EXPECT_EQ(kv.Reserve(13).code(), absl::StatusCode::kResourceExhausted);
}

TEST(KvCacheTest, ForkSharesBlocksAndCopiesOnlyTheWrittenBlock) {
  auto pool = MakePool(16);
  {
    SequenceKv parent(pool.get());
    ASSERT_OK(parent.Reserve(6));  // blocks 0 (full) and 1 (half)
    Fill(parent, 0, 6, 100);
    parent.set_length(6);
    EXPECT_EQ(pool->blocks_in_use(), 2);

    SequenceKv child(pool.get());
    child.ForkFrom(parent);
    EXPECT_EQ(child.length(), 6);
    EXPECT_EQ(pool->blocks_in_use(), 2) << "a fork copies no block";
    EXPECT_EQ(child.KeyRow(1, 5)[0], parent.KeyRow(1, 5)[0]);

    // The child writes position 6: only the shared, half-full block 1 is copied.
    ASSERT_OK(child.Reserve(7));
    EXPECT_EQ(pool->blocks_in_use(), 3);
    EXPECT_EQ(pool->copies_on_write(), 1);
    EXPECT_EQ(child.KeyRow(1, 5)[0], 100 + 51) << "the copy keeps the shared prefix";
    Fill(child, 6, 7, 500);
    child.set_length(7);
    // The parent's block is untouched by the child's writes, and the full
    // block 0 is still shared.
    ASSERT_OK(parent.Reserve(7));  // the parent is now the only owner of its block 1: no copy
    EXPECT_EQ(pool->copies_on_write(), 1);
    Fill(parent, 6, 7, 900);
    EXPECT_EQ(child.KeyRow(0, 6)[0], 500 + 60);
    EXPECT_EQ(parent.KeyRow(0, 6)[0], 900 + 60);
    EXPECT_EQ(child.KeyRow(0, 0), parent.KeyRow(0, 0)) << "block 0 is shared by reference";
  }
  EXPECT_EQ(pool->blocks_in_use(), 0) << "every reference released";
}

// The row lists attention reads are KeyRow/ValueRow position by position:
// across block boundaries, at a partial last block, and through a fork's
// shared and copied blocks.
TEST(KvCacheTest, AppendedRowsAreTheRowsOfEveryPosition) {
  auto pool = MakePool(16);
  SequenceKv parent(pool.get());
  ASSERT_OK(parent.Reserve(11));
  Fill(parent, 0, 11, 100);
  parent.set_length(11);
  SequenceKv child(pool.get());
  child.ForkFrom(parent);
  ASSERT_OK(child.Reserve(14));  // copies the shared, partial block 2
  for (SequenceKv* kv : {&parent, &child}) {
    for (int64_t layer = 0; layer < 2; ++layer) {
      for (int64_t end : {0, 1, 4, 5, 11}) {
        std::vector<const float*> rows = {nullptr};  // appended after what is there
        kv->AppendKeyRows(layer, end, rows);
        kv->AppendValueRows(layer, end, rows);
        ASSERT_EQ(rows.size(), static_cast<size_t>(1 + 2 * end));
        for (int64_t p = 0; p < end; ++p) {
          EXPECT_EQ(rows[1 + p], kv->KeyRow(layer, p)) << "layer " << layer << " position " << p;
          EXPECT_EQ(rows[1 + end + p], kv->ValueRow(layer, p)) << "layer " << layer << " position " << p;
        }
      }
    }
  }
  EXPECT_NE(child.KeyRow(0, 8), parent.KeyRow(0, 8)) << "block 2 was copied for the child";
}

TEST(KvCacheTest, ForkOfABlockAlignedSequenceCopiesNothing) {
  auto pool = MakePool(16);
  SequenceKv parent(pool.get());
  ASSERT_OK(parent.Reserve(8));
  parent.set_length(8);
  SequenceKv a(pool.get()), b(pool.get());
  a.ForkFrom(parent);
  b.ForkFrom(parent);
  ASSERT_OK(a.Reserve(9));
  ASSERT_OK(b.Reserve(9));
  EXPECT_EQ(pool->copies_on_write(), 0) << "new positions start a new block";
  EXPECT_EQ(pool->blocks_in_use(), 4);
}

TEST(KvCacheTest, ForkReplacesTheForkedSequencesOwnBlocks) {
  auto pool = MakePool(16);
  SequenceKv a(pool.get()), b(pool.get());
  ASSERT_OK(a.Reserve(4));
  a.set_length(4);
  ASSERT_OK(b.Reserve(8));
  b.set_length(8);
  EXPECT_EQ(pool->blocks_in_use(), 3);
  b.ForkFrom(a);
  EXPECT_EQ(pool->blocks_in_use(), 1);
  EXPECT_EQ(b.length(), 4);
}

}  // namespace
}  // namespace tandem
