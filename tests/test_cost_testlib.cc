#include "tests/test_cost_testlib.h"

namespace tandem {

CostModelParams PoolMattersCost(const ModelConfig& config) {
  CostModelParams p;
  p.expert_bytes = 3 * config.hidden_size * config.intermediate_size * 2;
  p.activation_row_bytes = config.hidden_size * 4;
  p.transports.push_back({"local", TransferCost{}});
  p.cpu_workers.push_back({RooflineCurve{40, 0, 10}, 0});
  p.gpu = RooflineCurve{10, 0, 0.5};
  p.migrate = TransferCost{30, 0};
  p.dma = TransferCost{};
  return p;
}

}  // namespace tandem
