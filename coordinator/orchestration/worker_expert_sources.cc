#include "coordinator/orchestration/worker_expert_sources.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<WorkerExpertSources>> WorkerExpertSources::Open(const ModelConfig& config,
                                                                               const std::vector<std::string>& regions,
                                                                               bool writable) {
  auto out = std::unique_ptr<WorkerExpertSources>(new WorkerExpertSources());
  const int64_t d = config.hidden_size;
  // A dense layer has no experts: its list stays empty.
  out->sources_.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (config.moe_layer(l))
      out->sources_[static_cast<size_t>(l)].resize(static_cast<size_t>(config.num_local_experts));
  }
  for (size_t w = 0; w < regions.size(); ++w) {
    if (regions[w].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", w, " reports no expert store, so the expert pool has nothing to copy from (an echo worker?)"));
    }
    auto view = ExpertStoreView::Open(regions[w], writable ? ShmAccess::kReadWrite : ShmAccess::kReadOnly);
    if (writable && !view.ok() && view.status().code() == absl::StatusCode::kInternal) {
      // Not ours to write (another user's store?): read-only still serves,
      // the pool then copies from it unpinned.
      LOG_WARNING("worker ", w, "'s expert store ", regions[w], " cannot be mapped writable (", view.status().message(),
                  "); mapped read-only, so the GPU pool cannot page-lock it");
      view = ExpertStoreView::Open(regions[w], ShmAccess::kReadOnly);
    }
    if (!view.ok()) {
      return absl::Status(
          view.status().code(),
          absl::StrCat("worker ", w, "'s expert store ", regions[w],
                       " (the pool copies experts from it; workers must run on this host): ", view.status().message()));
    }
    for (const ExpertSlice& slice : view->slices()) {
      if (slice.layer < 0 || slice.layer >= config.num_hidden_layers || config.dense_layer(slice.layer) ||
          slice.expert < 0 || slice.expert >= config.num_local_experts) {
        return absl::InvalidArgumentError(absl::StrCat(regions[w], ": slice of layer ", slice.layer, " expert ",
                                                       slice.expert, " is outside the model's MoE layers"));
      }
      const ExpertWeights* weights = view->Find(slice.layer, slice.expert);
      ExpertSource& source = out->sources_[static_cast<size_t>(slice.layer)][static_cast<size_t>(slice.expert)];
      const int64_t s = slice.size(), begin = slice.intermediate_begin;
      // Two workers' pieces of one expert must agree on its blocks' order.
      if (!source.w1.empty() && (source.w1_order != weights->w1.order || source.w2_order != weights->w2.order)) {
        return absl::InvalidArgumentError(
            absl::StrCat(regions[w], ": layer ", slice.layer, " expert ", slice.expert, " is stored in ",
                         BlockOrderName(weights->w1.order), " block order, another worker's part of it in ",
                         BlockOrderName(source.w1_order), ": start every worker with the same --block_order"));
      }
      source.w1_dtype = weights->w1.dtype;
      source.w3_dtype = weights->w3.dtype;
      source.w2_dtype = weights->w2.dtype;
      source.w1_order = weights->w1.order;
      source.w3_order = weights->w3.order;
      source.w2_order = weights->w2.order;
      // w1/w3 [S, D]: rows begin..end of [I, D]; w2 [D, S]: columns begin..end of [D, I]
      // (in values; a quantized w2's slices start and end on whole blocks).
      source.w1.push_back({.data = weights->w1.data, .row0 = begin, .col0 = 0, .rows = s, .cols = d, .pitch = d});
      source.w3.push_back({.data = weights->w3.data, .row0 = begin, .col0 = 0, .rows = s, .cols = d, .pitch = d});
      source.w2.push_back({.data = weights->w2.data, .row0 = 0, .col0 = begin, .rows = d, .cols = s, .pitch = s});
    }
    out->views_.push_back(std::move(*view));
  }
  // Every expert covered exactly once is checked piece by piece when the
  // pool is created (CheckExpertSources); an expert no store holds is
  // caught here with a clearer message.
  for (size_t l = 0; l < out->sources_.size(); ++l) {
    for (size_t e = 0; e < out->sources_[l].size(); ++e) {
      if (out->sources_[l][e].w1.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("no worker's expert store holds layer ", l, " expert ", e, " (", regions.size(), " stores)"));
      }
    }
  }
  return out;
}

std::vector<PinnedHostRegion> WorkerExpertSources::regions() const {
  std::vector<PinnedHostRegion> out;
  for (const ExpertStoreView& view : views_) out.push_back({view.data(), view.region_bytes()});
  return out;
}

int64_t WorkerExpertSources::mapped_bytes() const {
  int64_t bytes = 0;
  for (const ExpertStoreView& view : views_) bytes += static_cast<int64_t>(view.region_bytes());
  return bytes;
}

}  // namespace tandem
