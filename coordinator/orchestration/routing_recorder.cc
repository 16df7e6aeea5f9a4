#include "coordinator/orchestration/routing_recorder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "coordinator/orchestration/planner/routing_trace_io.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<RoutingRecorder>> RoutingRecorder::Create(const ModelConfig& config,
                                                                         const RoutingRecorderOptions& options) {
  if (config.num_hidden_layers < 1 || config.num_local_experts < 1) {
    return absl::InvalidArgumentError("config: the model has no layers or no experts to record");
  }
  auto recorder = std::unique_ptr<RoutingRecorder>(new RoutingRecorder(config, options));
  if (!options.trace_path.empty()) {
    recorder->trace_.open(options.trace_path, std::ios::binary | std::ios::trunc);
    if (!recorder->trace_) {
      return absl::InvalidArgumentError(absl::StrCat("trace_path: cannot write ", options.trace_path));
    }
    recorder->trace_ << RoutingTraceHeaderLine(options.model_name, recorder->num_layers_, recorder->num_experts_,
                                               static_cast<int>(config.num_experts_per_tok), config.dense_layers)
                     << "\n";
    recorder->trace_.flush();
  }
  return recorder;
}

RoutingRecorder::RoutingRecorder(const ModelConfig& config, const RoutingRecorderOptions& options)
    : options_(options),
      num_layers_(static_cast<int>(config.num_hidden_layers)),
      num_experts_(static_cast<int>(config.num_local_experts)) {
  usage_.num_layers = num_layers_;
  usage_.num_experts = num_experts_;
  usage_.tokens.assign(static_cast<size_t>(num_layers_) * static_cast<size_t>(num_experts_), 0.0);
}

RoutingRecorder::~RoutingRecorder() {
  absl::Status status = Finish();
  if (!status.ok()) LOG_ERROR("routing recorder: ", status.ToString());
}

void RoutingRecorder::OnStepBegin(const ForwardStep& step) {
  rows_.resize(step.sequences.size());
  for (std::vector<int32_t>& r : rows_)
    r.assign(static_cast<size_t>(num_layers_) * static_cast<size_t>(num_experts_), 0);
}

void RoutingRecorder::OnRouting(const ForwardStep& step, int layer, std::span<const int32_t> experts,
                                int num_experts_per_token) {
  if (layer < 0 || layer >= num_layers_) return;
  for (size_t s = 0; s < step.sequences.size() && s < rows_.size(); ++s) {
    const StepSequence& seq = step.sequences[s];
    int32_t* rows = rows_[s].data() + static_cast<size_t>(layer) * static_cast<size_t>(num_experts_);
    const size_t begin = static_cast<size_t>(seq.row_offset) * static_cast<size_t>(num_experts_per_token);
    const size_t end = std::min(experts.size(), begin + static_cast<size_t>(seq.num_tokens) * num_experts_per_token);
    for (size_t i = begin; i < end; ++i) {
      const int32_t e = experts[i];
      if (e >= 0 && e < num_experts_) ++rows[e];
    }
  }
}

void RoutingRecorder::OnStepEnd(const ForwardStep& step, const absl::Status& status) {
  if (!status.ok() || finished_) return;  // a failed step ran nothing for good
  for (size_t s = 0; s < step.sequences.size() && s < rows_.size(); ++s) {
    const StepSequence& seq = step.sequences[s];
    for (size_t i = 0; i < rows_[s].size(); ++i) usage_.tokens[i] += rows_[s][i];
    if (trace_.is_open()) {
      RoutingTraceLine line{step.index,         seq.id,         seq.prefill ? Phase::kPrefill : Phase::kDecode,
                            seq.start_position, seq.num_tokens, rows_[s]};
      trace_ << RoutingTraceStepLine(line, num_layers_, num_experts_) << "\n";
    }
  }
  if (trace_.is_open()) {
    trace_.flush();
    if (!trace_ && status_.ok())
      status_ = absl::DataLossError(absl::StrCat("writing ", options_.trace_path, " failed"));
  }
  ++steps_recorded_;
}

absl::Status RoutingRecorder::Finish() {
  if (finished_) return status_;
  finished_ = true;
  if (trace_.is_open()) {
    trace_.close();
    if (!trace_ && status_.ok())
      status_ = absl::DataLossError(absl::StrCat("closing ", options_.trace_path, " failed"));
  }
  if (!options_.usage_path.empty()) {
    absl::Status saved = SaveExpertUsage(usage_, options_.model_name, options_.usage_path);
    if (!saved.ok() && status_.ok()) status_ = saved;
  }
  return status_;
}

}  // namespace tandem
