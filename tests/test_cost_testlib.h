// A cost model for orchestrator tests in which the pool matters: a migrated
// expert beats the CPU from a few rows on (threshold/makespan then copy at
// prefill and keep decode on the CPU), and the adaptive policy finds slots
// worth their copy. Given to the runtime so no test depends on calibration.
#pragma once

#include "common/model/model_config.h"
#include "coordinator/orchestration/planner/cost_model.h"

namespace tandem {

CostModelParams PoolMattersCost(const ModelConfig& config);

}  // namespace tandem
