// Turns for tokenizing large texts. A tokenizer's scratch memory grows with
// its input (SentencePiece holds a symbol per character and a merge queue:
// tens of bytes per byte of text), so a handful of multi-megabyte prompts
// tokenized at once could hold gigabytes. Texts over kLargeTextBytes take
// turns, kLargeTextsAtOnce at a time; small ones never wait. After a text
// over kTrimAfterBytes the heap is trimmed, so the scratch is given back to
// the system rather than kept by the allocator.
//
// Thread-safe: any thread may take a turn.
#pragma once

#include <malloc.h>

#include <cstddef>

#include "absl/synchronization/mutex.h"

namespace tandem {

inline constexpr size_t kLargeTextBytes = 256 << 10;
inline constexpr int kLargeTextsAtOnce = 2;
inline constexpr size_t kTrimAfterBytes = 1 << 20;

class LargeTextTurns {
 public:
  // Holds a turn for a text of `bytes` (none for a small text) until destroyed.
  class Turn {
   public:
    Turn(LargeTextTurns* turns, size_t bytes) : turns_(bytes > kLargeTextBytes ? turns : nullptr), bytes_(bytes) {
      if (turns_ != nullptr) turns_->Enter();
    }
    ~Turn() {
      if (turns_ == nullptr) return;
      turns_->Leave();
      if (bytes_ > kTrimAfterBytes) malloc_trim(0);
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    LargeTextTurns* turns_;
    size_t bytes_;
  };

 private:
  void Enter() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* in_use) { return *in_use < kLargeTextsAtOnce; }, &in_use_));
    ++in_use_;
  }
  void Leave() {
    absl::MutexLock lock(&mu_);
    --in_use_;
  }

  absl::Mutex mu_;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem
