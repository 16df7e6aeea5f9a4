// The shared-memory pieces in one process (and a forked child for a dead
// owner): ShmRegion's create/open/ownership/stale reclaim, the arena's header
// checks, descriptor validation, and the doorbell round trip with its
// timeout and dead-peer detection. The model fingerprint is tested here too.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/model/synthetic_model.h"
#include "common/platform/shm_region.h"
#include "common/platform/shm_transport.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

// Unlinks a name at scope exit, whatever the test did.
struct NameGuard {
  std::string name;
  ~NameGuard() { shm_unlink(name.c_str()); }
};

TEST(ShmRegionTest, CreateOpenAndUnlinkByOwner) {
  NameGuard guard{UniqueRegionPrefix()};
  {
    auto owner = ShmRegion::Create(guard.name, 10000);
    ASSERT_OK(owner);
    EXPECT_TRUE(owner->owner());
    EXPECT_EQ(owner->size(), 10000u);
    owner->bytes()[123] = 42;

    auto reader = ShmRegion::Open(guard.name, ShmAccess::kReadOnly);
    ASSERT_OK(reader);
    EXPECT_FALSE(reader->owner());
    EXPECT_EQ(reader->size(), 10000u);
    EXPECT_EQ(reader->bytes()[123], 42);
    EXPECT_TRUE(reader->OwnerAlive());

    auto again = ShmRegion::Create(guard.name, 4096);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();

    ShmRegion moved = std::move(*owner);  // ownership moves with the object
    EXPECT_TRUE(moved.owner());
    EXPECT_FALSE(owner->valid());
  }
  auto gone = ShmRegion::Open(guard.name, ShmAccess::kReadOnly);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

TEST(ShmRegionTest, BadNamesAndSizesAreInvalidArgument) {
  for (const std::string& name : std::vector<std::string>{"", "/", "no-slash", "/a/b", "/" + std::string(300, 'x')}) {
    EXPECT_EQ(ShmRegion::Create(name, 4096).status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_EQ(ShmRegion::Create(UniqueRegionPrefix(), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmRegionTest, AStaleRegionOfADeadOwnerIsReclaimed) {
  NameGuard guard{UniqueRegionPrefix()};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto region = ShmRegion::Create(guard.name, 4096);
    _exit(region.ok() ? 0 : 1);  // no destructor: the name stays, the lock goes with the process
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  auto stale = ShmRegion::Open(guard.name, ShmAccess::kReadWrite);
  ASSERT_OK(stale);
  EXPECT_FALSE(stale->OwnerAlive());
  EXPECT_EQ(ShmRegion::Create(guard.name, 4096, {.reclaim_stale = false}).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto fresh = ShmRegion::Create(guard.name, 8192);
  ASSERT_OK(fresh);
  EXPECT_EQ(fresh->size(), 8192u);
}

class ArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto arena = ShmArena::Create(ArenaOptions{.name = guard_.name, .num_slots = 2, .slot_bytes = 8192});
    ASSERT_OK(arena);
    worker_ = std::move(*arena);
    auto opened = ShmArena::Open(guard_.name);
    ASSERT_OK(opened);
    coordinator_ = std::move(*opened);
  }
  ArenaTensorRef Ref(ArenaSide side, uint32_t slot, uint64_t offset, int64_t rows) {
    return ArenaTensorRef{side, slot, offset, {rows, kHidden}, DType::kF32, coordinator_->sequence(side, slot)};
  }
  static constexpr int64_t kHidden = 16;
  NameGuard guard_{UniqueRegionPrefix()};
  std::unique_ptr<ShmArena> worker_, coordinator_;
};

TEST_F(ArenaTest, BothSidesSeeTheSameLayout) {
  EXPECT_EQ(coordinator_->num_slots(), 2u);
  EXPECT_EQ(coordinator_->slot_bytes(), 8192u);
  EXPECT_EQ(coordinator_->total_bytes(), worker_->total_bytes());
  EXPECT_EQ(coordinator_->owner_pid(), getpid());
  EXPECT_EQ(coordinator_->instance(), worker_->instance());
  coordinator_->slot_data(ArenaSide::kInput, 1)[5] = 7;
  EXPECT_EQ(worker_->slot_data(ArenaSide::kInput, 1)[5], 7);
  const uint64_t seq = coordinator_->AdvanceSequence(ArenaSide::kOutput, 1);
  EXPECT_EQ(worker_->sequence(ArenaSide::kOutput, 1), seq);
  EXPECT_EQ(worker_->sequence(ArenaSide::kInput, 1), 0u);
}

TEST_F(ArenaTest, CorruptHeaderIsDataLossNamingTheField) {
  auto raw = ShmRegion::Open(guard_.name, ShmAccess::kReadWrite);
  ASSERT_OK(raw);
  uint32_t* num_slots = reinterpret_cast<uint32_t*>(raw->bytes() + 16);
  *num_slots = 1000;
  auto opened = ShmArena::Open(guard_.name);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_NE(opened.status().message().find("num_slots"), std::string::npos) << opened.status();
  *num_slots = 2;
  raw->bytes()[0] ^= 0xff;  // magic
  opened = ShmArena::Open(guard_.name);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_NE(opened.status().message().find("magic"), std::string::npos) << opened.status();
  raw->bytes()[0] ^= 0xff;
  EXPECT_OK(ShmArena::Open(guard_.name));
}

TEST_F(ArenaTest, DescriptorValidation) {
  coordinator_->AdvanceSequence(ArenaSide::kInput, 0);
  auto ok = worker_->Resolve(Ref(ArenaSide::kInput, 0, 64, 3), 3, kHidden, "t");
  ASSERT_OK(ok);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(*ok), worker_->slot_data(ArenaSide::kInput, 0) + 64);
  // The last row ends exactly at the slot's end: fine; one float more is not.
  const int64_t rows_fit = 8192 / (kHidden * 4);
  EXPECT_OK(worker_->Resolve(Ref(ArenaSide::kInput, 0, 0, rows_fit), rows_fit, kHidden, "t"));
  EXPECT_OK(worker_->Resolve(Ref(ArenaSide::kInput, 0, 0, 0), 0, kHidden, "t"));

  struct Case {
    ArenaTensorRef ref;
    int64_t rows;
    absl::StatusCode code;
    std::string expect;
  };
  ArenaTensorRef bad_dtype = Ref(ArenaSide::kInput, 0, 0, 1);
  bad_dtype.dtype = DType::kBF16;
  ArenaTensorRef no_dtype = Ref(ArenaSide::kInput, 0, 0, 1);
  no_dtype.dtype.reset();
  ArenaTensorRef stale = Ref(ArenaSide::kInput, 0, 0, 1);
  stale.sequence -= 1;
  ArenaTensorRef three_d = Ref(ArenaSide::kInput, 0, 0, 1);
  three_d.shape = {1, kHidden, 1};
  const std::vector<Case> cases = {
      {Ref(ArenaSide::kInput, 2, 0, 1), 1, absl::StatusCode::kInvalidArgument, "slot 2 out of range"},
      {Ref(ArenaSide::kInput, 0, 8192 - 60, 1), 1, absl::StatusCode::kInvalidArgument, "outside the slot"},
      {Ref(ArenaSide::kInput, 0, 64, rows_fit), rows_fit, absl::StatusCode::kInvalidArgument, "outside the slot"},
      {Ref(ArenaSide::kInput, 0, ~uint64_t{0} - 7, 1), 1, absl::StatusCode::kInvalidArgument, "outside the slot"},
      {Ref(ArenaSide::kInput, 0, 0, int64_t{1} << 61), int64_t{1} << 61, absl::StatusCode::kInvalidArgument,
       "outside the slot"},
      {Ref(ArenaSide::kInput, 0, 2, 1), 1, absl::StatusCode::kInvalidArgument, "aligned"},
      {Ref(ArenaSide::kInput, 0, 0, 2), 1, absl::StatusCode::kInvalidArgument, "shape"},
      {three_d, 1, absl::StatusCode::kInvalidArgument, "shape"},
      {bad_dtype, 1, absl::StatusCode::kInvalidArgument, "dtype BF16"},
      {no_dtype, 1, absl::StatusCode::kInvalidArgument, "dtype unspecified"},
      {stale, 1, absl::StatusCode::kDataLoss, "sequence"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = worker_->Resolve(cases[i].ref, cases[i].rows, kHidden, "layer 0 expert 1 input");
    ASSERT_FALSE(r.ok()) << "case " << i;
    EXPECT_EQ(r.status().code(), cases[i].code) << "case " << i << ": " << r.status();
    EXPECT_NE(r.status().message().find(cases[i].expect), std::string::npos) << "case " << i << ": " << r.status();
    EXPECT_NE(r.status().message().find("layer 0 expert 1 input"), std::string::npos) << r.status();
  }
}

TEST_F(ArenaTest, DoorbellRoundTrip) {
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    while (!stop) {
      auto request = worker_->AwaitRequest(absl::Microseconds(20), absl::Milliseconds(50));
      if (!request) continue;
      if (request->message == "fail") {
        worker_->PostResponse(request->seq, absl::InvalidArgumentError("asked to fail"), "");
      } else {
        worker_->PostResponse(request->seq, absl::OkStatus(), "echo:" + request->message);
      }
    }
  });
  for (int i = 0; i < 200; ++i) {
    const std::string message = "request " + std::to_string(i);
    auto seq = coordinator_->PostRequest(message);
    ASSERT_OK(seq);
    std::string_view response;
    // Alternate spinning and sleeping waits.
    absl::Status s = coordinator_->AwaitResponse(*seq, absl::Now() + absl::Seconds(5),
                                                 i % 2 ? absl::Microseconds(200) : absl::ZeroDuration(), &response);
    ASSERT_OK(s);
    EXPECT_EQ(response, "echo:" + message);
  }
  auto seq = coordinator_->PostRequest("fail");
  ASSERT_OK(seq);
  std::string_view response;
  absl::Status s = coordinator_->AwaitResponse(*seq, absl::Now() + absl::Seconds(5), absl::ZeroDuration(), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "asked to fail");

  EXPECT_EQ(coordinator_->PostRequest(std::string(coordinator_->control_message_bytes() + 1, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  stop = true;
  worker_->Interrupt();
  worker.join();
}

TEST_F(ArenaTest, NoAnswerIsDeadlineExceededAndTheNextPostWaitsForIt) {
  auto seq = coordinator_->PostRequest("nobody listens");
  ASSERT_OK(seq);
  std::string_view response;
  const absl::Time start = absl::Now();
  absl::Status s =
      coordinator_->AwaitResponse(*seq, start + absl::Milliseconds(100), absl::Microseconds(10), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_TRUE(coordinator_->ResponsePending());
  EXPECT_EQ(coordinator_->PostRequest("next").status().code(), absl::StatusCode::kFailedPrecondition);
  auto late = worker_->AwaitRequest(absl::ZeroDuration(), absl::Milliseconds(100));
  ASSERT_TRUE(late.has_value());
  worker_->PostResponse(late->seq, absl::OkStatus(), "late");
  EXPECT_FALSE(coordinator_->ResponsePending());
  EXPECT_OK(coordinator_->PostRequest("next"));
}

TEST(ArenaDeathTest, ADeadWorkerIsUnavailableQuickly) {
  NameGuard guard{UniqueRegionPrefix()};
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto arena = ShmArena::Create(ArenaOptions{.name = guard.name, .slot_bytes = 4096});
    const char byte = arena.ok() ? 1 : 0;
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    pause();  // never answers; killed by the parent
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 1);
  auto arena = ShmArena::Open(guard.name);
  ASSERT_OK(arena);
  auto seq = (*arena)->PostRequest("hello");
  ASSERT_OK(seq);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  close(ready[0]);
  close(ready[1]);
  std::string_view response;
  const absl::Time start = absl::Now();
  absl::Status s = (*arena)->AwaitResponse(*seq, start + absl::Seconds(5), absl::Microseconds(10), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("exited"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST(ModelFingerprintTest, SameModelSameFingerprintAndEveryChangeShows) {
  auto tiny = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 1});
  auto tiny_other_seed = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 2});
  auto tiny3 = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .num_layers = 3, .seed = 1});
  auto tiny_f32 = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 1, .dtype = DType::kF32});
  auto phi = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny-phimoe", .seed = 1});
  ASSERT_OK(tiny);
  ASSERT_OK(tiny_other_seed);
  ASSERT_OK(tiny3);
  ASSERT_OK(tiny_f32);
  ASSERT_OK(phi);
  auto fp = [](const std::unique_ptr<Model>& m) {
    auto f = FingerprintModel(m->config, *m->weights->source);
    EXPECT_OK(f);
    return f.ok() ? *f : ModelFingerprint{};
  };
  const ModelFingerprint a = fp(*tiny);
  EXPECT_EQ(a, fp(*tiny));
  EXPECT_EQ(a, fp(*tiny_other_seed));  // values are not hashed
  EXPECT_EQ(a, FingerprintConfig((*tiny)->config, DType::kBF16));
  EXPECT_EQ(a.num_layers, 2);
  EXPECT_EQ(a.num_experts, 4);
  EXPECT_EQ(a.hidden_size, 64);

  const ModelFingerprint b = fp(*tiny3);
  EXPECT_NE(a.config_hash, b.config_hash);
  EXPECT_NE(a.tensors_hash, b.tensors_hash);
  const ModelFingerprint c = fp(*tiny_f32);
  EXPECT_EQ(a.config_hash, c.config_hash);  // torch_dtype is not meaning
  EXPECT_NE(a.tensors_hash, c.tensors_hash);
  const ModelFingerprint d = fp(*phi);
  EXPECT_NE(a.config_hash, d.config_hash);
  EXPECT_NE(a.architecture, d.architecture);

  ModelConfig tweaked = (*tiny)->config;
  tweaked.rope_theta *= 2;
  EXPECT_NE(FingerprintConfig(tweaked, DType::kBF16).config_hash, a.config_hash);
  EXPECT_NE(FingerprintString(a).find("config="), std::string::npos);
}

}  // namespace
}  // namespace tandem
