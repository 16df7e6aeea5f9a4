// The planner's files, and the only I/O in coordinator/planner/:
//   - hardware profiles: a cost model (CostModelParams) plus what machine and
//     model it describes and where every number came from. Measured ones are
//     cached by calibration (keyed by machine + model + config); the ones in
//     bench/profiles/ are built from the papers' published figures so plans
//     and simulations can be run for those machines.
//   - expert usage profiles: tokens per expert on calibration prompts, the
//     input of the `popularity` placement (Fiddler §3.4).
// JSON via nlohmann; the format is documented in bench/profiles/README.md.
// Errors are InvalidArgument naming the file and the field's full path
// (e.g. `cost_model.cpu_workers[0].compute.plateau_us is missing`); a file
// that cannot be read is NotFound.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/orchestration/planner/cost_model.h"
#include "coordinator/orchestration/planner/placement.h"

namespace tandem {

struct ProfiledModel {
  std::string name;  // e.g. "Mixtral-8x7B"
  int num_layers = 0;
  int num_experts = 0;  // per layer
  int num_experts_per_token = 0;
  int gpu_expert_slots = 0;  // experts that fit next to the non-expert weights
};

struct HardwareProfile {
  std::string name;
  std::string description;
  std::string source;          // where the profile as a whole comes from (paper, section, or "measured")
  std::string cache_key;       // calibration: machine + model + config fingerprint; empty for paper profiles
  std::string gpu, cpu, pcie;  // the machine, in words
  ProfiledModel model;
  CostModelParams cost;  // expert_bytes and activation_row_bytes live under "model" in the file
  // The CPU kernels' path per row count measured with the curves
  // (common/kernels/kernel_plan.h spelling, e.g. "1:stream,8:bf16_dot"), so
  // a cached profile brings back the kernels its curves were timed with;
  // empty for paper profiles. Under "machine" in the file.
  std::string kernel_plan;
  std::string kernel_plan_source;
  // Provenance: JSON path of an object → its "source" text, in file order.
  std::vector<std::pair<std::string, std::string>> sources;
};

absl::StatusOr<HardwareProfile> ParseHardwareProfile(const std::string& json_text, const std::string& file_name);
absl::StatusOr<HardwareProfile> LoadHardwareProfile(const std::string& path);
// Curves are written as fitted parameters (any "table" they came from is
// not kept); sources are written back where they were.
std::string HardwareProfileToJson(const HardwareProfile& profile);
absl::Status SaveHardwareProfile(const HardwareProfile& profile, const std::string& path);

absl::StatusOr<ExpertUsage> ParseExpertUsage(const std::string& json_text, const std::string& file_name);
absl::StatusOr<ExpertUsage> LoadExpertUsage(const std::string& path);
std::string ExpertUsageToJson(const ExpertUsage& usage, const std::string& model_name);
absl::Status SaveExpertUsage(const ExpertUsage& usage, const std::string& model_name, const std::string& path);

}  // namespace tandem
