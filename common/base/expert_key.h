// One expert of one layer: the name the planner, the cache policies and the
// GPU expert pool all use for "which weights". In common/ because
// coordinator/ (planner) and gpu_worker/ (pool) both speak it and gpu_worker/
// never includes coordinator/.
#pragma once

namespace tandem {

struct ExpertKey {
  int layer = 0;
  int expert = 0;
  friend bool operator==(const ExpertKey&, const ExpertKey&) = default;
};

}  // namespace tandem
