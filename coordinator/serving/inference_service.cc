#include "coordinator/serving/inference_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/cpu_features.h"
#include "common/base/dtype.h"
#include "common/kernels/attention_block.h"
#include "common/kernels/linear.h"
#include "common/model/model_fingerprint.h"
#include "coordinator/generation/sampling_defaults.h"
#include "coordinator/generation/utf8_stream.h"

namespace tandem {
namespace {

// How often a waiting handler looks at its call (cancelled? past deadline?).
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return v1::FINISH_REASON_EOS;
    case FinishReason::kStopId: return v1::FINISH_REASON_STOP_ID;
    case FinishReason::kStopString: return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kMaxTokens: return v1::FINISH_REASON_MAX_TOKENS;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const RequestUsage& u, v1::Usage* out) {
  out->set_prompt_tokens(u.prompt_tokens);
  out->set_generated_tokens(u.generated_tokens);
  out->set_queue_ms(u.queue_ms);
  out->set_time_to_first_token_ms(u.time_to_first_token_ms);
  out->set_mean_inter_token_ms(u.mean_inter_token_ms);
  out->set_p50_inter_token_ms(u.p50_inter_token_ms);
  out->set_p99_inter_token_ms(u.p99_inter_token_ms);
  out->set_tokens_per_s(u.tokens_per_s);
  out->set_total_ms(u.total_ms);
  out->set_cached_prompt_tokens(u.cached_prompt_tokens);
}

// In id order: a proto map's order is unspecified, and the entries are
// checked (ValidateLogitBias) where the request is.
std::vector<LogitBias> LogitBiasFromProto(const google::protobuf::Map<int32_t, float>& map) {
  std::vector<LogitBias> out;
  out.reserve(map.size());
  for (const auto& [id, bias] : map) out.push_back({id, bias});
  std::sort(out.begin(), out.end(), [](const LogitBias& a, const LogitBias& b) { return a.id < b.id; });
  return out;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

InferenceService::InferenceService(const Model* model, Scheduler* scheduler, InferenceServiceOptions options)
    : model_(model),
      scheduler_(scheduler),
      options_(std::move(options)),
      watchdog_(2 * scheduler->options().max_stall) {
  const ModelWeights& w = *model_->weights;
  for (const std::string& name : w.source->Names()) {
    absl::StatusOr<TensorView> tensor = w.source->Get(name);
    if (tensor.ok()) parameters_ += tensor->num_elements();
  }
  const size_t moe_layer = static_cast<size_t>(model_->config.first_moe_layer());
  if (moe_layer < w.layers.size() && !w.layers[moe_layer].experts.empty()) {
    const ExpertWeights& expert = w.layers[moe_layer].experts[0];
    for (const LinearWeight* lw : {&expert.w1, &expert.w2, &expert.w3}) expert_bytes_ += lw->bytes();
  }
  max_token_bytes_ = MaxTokenTextBytes(*model_);
  absl::StatusOr<ModelFingerprint> fingerprint = FingerprintModel(model_->config, *w.source);
  fingerprint_ = fingerprint.ok() ? FingerprintString(*fingerprint) : fingerprint.status().ToString();
}

std::optional<StreamEvent> InferenceService::NextEvent(grpc::ServerContext* context, RequestStream& stream) {
  while (true) {
    std::optional<StreamEvent> event = stream.Next(kPollInterval);
    if (event) return event;
    if (context->IsCancelled()) {
      const bool past_deadline = context->deadline() <= std::chrono::system_clock::now();
      stream.Cancel(past_deadline ? absl::DeadlineExceededError("the request's deadline passed")
                                  : absl::CancelledError("the client cancelled the request"));
      // The scheduler answers at its next step; wait for that so the
      // request's resources are accounted for before this call returns.
      while (true) {
        std::optional<StreamEvent> last = stream.Next(absl::Seconds(1));
        if (!last || last->done) return last;
      }
    }
  }
}

grpc::Status InferenceService::ClientGone(grpc::ServerContext* context, RequestStream& stream) {
  // The client cannot be written to: stop the work now, and return once the
  // scheduler has let go of the request.
  stream.Cancel(absl::CancelledError("the client went away"));
  NextEvent(context, stream);
  return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
}

grpc::Status InferenceService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptIds(request->prompt(), request->prompt_ids(), !request->has_add_bos() || request->add_bos());
  if (!prompt.ok()) return ToGrpcStatus(prompt.status());
  GenerateParams params;
  GenerationRequest& g = params.request;
  g.prompt_ids = std::move(*prompt);
  // Unset fields: the model's generation_config.json, then the server's.
  const GenerationDefaults& model_defaults = model_->defaults.generation;
  g.max_tokens = request->has_max_tokens() ? request->max_tokens() : DefaultMaxTokens(model_defaults, 16);
  auto optional = [](bool has, auto value) { return has ? std::optional(value) : std::nullopt; };
  g.sampling =
      ResolveSampling({.temperature = optional(request->has_temperature(), request->temperature()),
                       .top_p = optional(request->has_top_p(), request->top_p()),
                       .min_p = optional(request->has_min_p(), request->min_p()),
                       .repetition_penalty = optional(request->has_repetition_penalty(), request->repetition_penalty()),
                       .top_k = optional(request->has_top_k(), request->top_k())},
                      model_defaults);
  g.sampling.seed = request->has_seed() ? request->seed() : FreshSeed();
  g.stop_ids.assign(request->stop_ids().begin(), request->stop_ids().end());
  g.ignore_eos = request->ignore_eos();
  g.logprobs = request->logprobs();
  g.sampling.logit_bias = LogitBiasFromProto(request->logit_bias());
  params.stop_strings.assign(request->stop().begin(), request->stop().end());
  const uint64_t seed = g.sampling.seed;

  absl::StatusOr<std::shared_ptr<RequestStream>> stream = scheduler_->SubmitGenerate(std::move(params));
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  while (true) {
    std::optional<StreamEvent> event = NextEvent(context, **stream);
    if (!event) return grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled");
    v1::GenerateResponse response;
    for (const GeneratedToken& t : event->tokens) {
      v1::Token* token = response.add_tokens();
      token->set_id(t.id);
      token->set_text(t.text);
      token->set_logprob(t.logprob);
      for (const auto& [id, logprob] : t.top_logprobs) {
        v1::TopLogprob* top = token->add_top_logprobs();
        top->set_id(id);
        if (model_->tokenizer) top->set_text(SanitizeUtf8(model_->tokenizer->PieceText(id)));
        top->set_logprob(logprob);
      }
    }
    if (event->done) {
      if (!event->status.ok()) return ToGrpcStatus(event->status);
      response.set_done(true);
      response.set_finish_reason(ToProto(event->finish_reason));
      ToProto(event->usage, response.mutable_usage());
      response.set_seed(seed);
      Write(context, writer, response);
      return grpc::Status::OK;
    }
    if (!Write(context, writer, response)) return ClientGone(context, **stream);
  }
}

grpc::Status InferenceService::BeamSearch(grpc::ServerContext* context, const v1::BeamSearchRequest* request,
                                          grpc::ServerWriter<v1::BeamSearchResponse>* writer) {
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptIds(request->prompt(), request->prompt_ids(), !request->has_add_bos() || request->add_bos());
  if (!prompt.ok()) return ToGrpcStatus(prompt.status());
  BeamSearchJob job;
  job.prompt_ids = std::move(*prompt);
  BeamSearchParams& p = job.params;
  p.beam_width = request->has_beam_width() ? request->beam_width() : 4;
  p.max_tokens = request->has_max_tokens() ? request->max_tokens() : 16;
  p.length_penalty = request->has_length_penalty() ? request->length_penalty() : 1.0f;
  p.early_stopping = request->early_stopping();
  p.num_return_sequences = request->has_num_return_sequences() ? request->num_return_sequences() : 1;
  job.stop_ids.assign(request->stop_ids().begin(), request->stop_ids().end());
  job.ignore_eos = request->ignore_eos();
  job.stream_progress = request->stream_progress();
  p.logit_bias = LogitBiasFromProto(request->logit_bias());
  const double length_penalty = p.length_penalty;
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = scheduler_->SubmitBeamSearch(std::move(job));
  if (!stream.ok()) return ToGrpcStatus(stream.status());

  auto fill = [&](const std::vector<int32_t>& ids, v1::BeamSequence* out) {
    out->mutable_ids()->Add(ids.begin(), ids.end());
    if (model_->tokenizer) {
      absl::StatusOr<std::string> text = model_->tokenizer->Decode(ids);
      if (text.ok()) out->set_text(SanitizeUtf8(*text));
    }
  };
  const std::vector<int32_t> eos = model_->EosIds();
  while (true) {
    std::optional<StreamEvent> event = NextEvent(context, **stream);
    if (!event) return grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled");
    v1::BeamSearchResponse response;
    if (event->has_progress) {
      v1::BeamProgress* progress = response.mutable_progress();
      progress->set_step(event->progress.step);
      progress->set_live_beams(event->progress.live_beams);
      progress->set_finished(event->progress.finished);
      fill(event->progress.best.ids, progress->mutable_best());
      const LiveBeam& best = event->progress.best;
      progress->mutable_best()->set_sum_logprob(best.sum_logprob);
      progress->mutable_best()->set_score(
          best.ids.empty() ? 0.0 : best.sum_logprob / std::pow(static_cast<double>(best.ids.size()), length_penalty));
    }
    if (event->done) {
      if (!event->status.ok()) return ToGrpcStatus(event->status);
      for (const BeamHypothesis& h : event->beams) {
        v1::BeamSequence* sequence = response.add_sequences();
        fill(h.ids, sequence);
        sequence->set_score(h.score);
        sequence->set_sum_logprob(h.sum_logprob);
        const bool eos_end = !h.ids.empty() && std::find(eos.begin(), eos.end(), h.ids.back()) != eos.end();
        sequence->set_finish_reason(h.end == BeamEnd::kMaxTokens        ? v1::FINISH_REASON_MAX_TOKENS
                                    : eos_end && !request->ignore_eos() ? v1::FINISH_REASON_EOS
                                                                        : v1::FINISH_REASON_STOP_ID);
      }
      ToProto(event->usage, response.mutable_usage());
      response.set_done(true);
      Write(context, writer, response);
      return grpc::Status::OK;
    }
    if (!Write(context, writer, response)) return ClientGone(context, **stream);
  }
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext*, const v1::TokenizeRequest* request,
                                        v1::TokenizeResponse* response) {
  if (model_->tokenizer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this model has no tokenizer.model");
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      model_->tokenizer->Encode(request->text(), !request->has_add_bos() || request->add_bos());
  if (!ids.ok()) return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("text: ", ids.status().message())));
  for (int32_t id : *ids) {
    response->add_ids(id);
    response->add_pieces(SanitizeUtf8(model_->tokenizer->PieceText(id)));
  }
  return grpc::Status::OK;
}

grpc::Status InferenceService::Detokenize(grpc::ServerContext*, const v1::DetokenizeRequest* request,
                                          v1::DetokenizeResponse* response) {
  if (model_->tokenizer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this model has no tokenizer.model");
  }
  for (int i = 0; i < request->ids_size(); ++i) {
    if (request->ids(i) < 0 || request->ids(i) >= model_->config.vocab_size) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "ids[", i, "] = ", request->ids(i), " is outside the vocabulary [0, ", model_->config.vocab_size, ")")));
    }
  }
  std::vector<int32_t> ids(request->ids().begin(), request->ids().end());
  absl::StatusOr<std::string> text = model_->tokenizer->Decode(ids);
  if (!text.ok()) return ToGrpcStatus(text.status());
  response->set_text(SanitizeUtf8(*text));
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*, v1::ModelInfo* info) {
  const ModelConfig& c = model_->config;
  info->set_model_dir(options_.model_dir);
  info->set_architecture(c.architecture_name);
  info->set_vocab_size(c.vocab_size);
  info->set_hidden_size(c.hidden_size);
  info->set_intermediate_size(c.intermediate_size);
  info->set_num_layers(static_cast<int32_t>(c.num_hidden_layers));
  info->set_num_experts(static_cast<int32_t>(c.num_local_experts));
  info->set_experts_per_token(static_cast<int32_t>(c.num_experts_per_tok));
  info->set_max_context(c.max_position_embeddings);
  info->set_parameters(parameters_);
  info->set_expert_bytes(expert_bytes_);
  info->set_fingerprint(fingerprint_);
  info->set_has_tokenizer(model_->tokenizer != nullptr);
  info->set_bos_id(c.bos_token_id);
  info->mutable_eos_ids()->Add(c.eos_token_ids.begin(), c.eos_token_ids.end());
  info->set_placement_summary(options_.placement_summary);
  info->set_max_sequences(scheduler_->options().max_sequences);
  info->set_kv_cache_tokens(options_.kv_cache_tokens);
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetStats(grpc::ServerContext*, const v1::GetStatsRequest*, v1::ServerStats* out) {
  const SchedulerStats s = scheduler_->Stats();
  out->set_uptime_s(s.uptime_s);
  out->set_requests_total(s.requests_total);
  out->set_requests_active(s.requests_active);
  out->set_requests_waiting(s.requests_waiting);
  out->set_requests_succeeded(s.requests_succeeded);
  out->set_requests_failed(s.requests_failed);
  out->set_requests_cancelled(s.requests_cancelled);
  out->set_requests_rejected(s.requests_rejected);
  out->set_prompt_tokens(s.prompt_tokens);
  out->set_generated_tokens(s.generated_tokens);
  out->set_steps(s.steps);
  out->set_tokens_per_s(s.tokens_per_s);
  out->set_window_s(s.window_s);
  out->set_mean_step_ms(s.mean_step_ms);
  out->set_mean_batch_rows(s.mean_batch_rows);
  out->set_kv_blocks_in_use(s.kv_blocks_in_use);
  out->set_kv_blocks_total(s.kv_blocks_total);
  out->set_kv_block_size(s.kv_block_size);
  out->set_prompt_cache_hit_tokens(s.prompt_cache_hit_tokens);
  out->set_kv_blocks_cached(s.kv_blocks_cached);
  out->set_prompt_cache_evictions(s.prompt_cache_evictions);
  out->set_active_sequences(static_cast<int32_t>(s.active_sequences));
  for (size_t layer = 0; layer < s.mean_layers.size(); ++layer) {
    v1::LayerTiming* t = out->add_layers();
    t->set_layer(static_cast<int32_t>(layer));
    t->set_attention_ms(s.mean_layers[layer].attention_us / 1000.0);
    t->set_router_ms(s.mean_layers[layer].router_us / 1000.0);
    t->set_experts_ms(s.mean_layers[layer].experts_us / 1000.0);
  }
  if (options_.worker_health) {
    for (const WorkerHealthInfo& w : options_.worker_health()) {
      v1::WorkerHealth* health = out->add_workers();
      health->set_address(w.address);
      health->set_healthy(w.healthy);
      health->set_detail(w.detail);
    }
  }
  if (options_.orchestrator_json) out->set_orchestrator_json(options_.orchestrator_json());
  out->set_cpu(HostCpu().Description());
  out->set_cpu_flags(HostCpu().Flags());
  out->set_isa(ActiveIsaDescription());
  const KernelPlan& plan = ProcessKernelPlan();
  out->set_kernel_plan(absl::StrCat(plan.Spec(), " (", plan.source(), ")"));
  const DType dtype = model_->weights->layers.empty() ? DType::kBF16 : model_->weights->layers.front().q_proj.dtype;
  out->set_kernels(absl::StrCat(std::string(DTypeName(dtype)), " weights: ", DescribeKernelChoice(dtype), "; ",
                                DescribeAttentionKernels()));
  return grpc::Status::OK;
}

}  // namespace tandem
