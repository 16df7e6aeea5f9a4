// Legend as in expert_ffn.h: R rows, D hidden size, I intermediate size.
#include "cpu_worker/expert_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/parallel_status.h"
#include "common/base/status_macros.h"
#include "common/kernels/activation.h"

namespace tandem {
namespace {

absl::Status CheckWeight(const LinearWeight& w, const char* name, int64_t n, int64_t k) {
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: ", name, " has no data"));
  if (w.n != n || w.k != k)
    return absl::InvalidArgumentError(
        absl::StrCat("ExpertFfn: ", name, " is [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  if (IsQuantized(w.dtype) && k % DTypeBlockSize(w.dtype) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: ", name, " is ", std::string(DTypeName(w.dtype)),
                                                   " with rows of ", k, " values, not whole ", DTypeBlockSize(w.dtype),
                                                   "-value blocks"));
  }
  return absl::OkStatus();
}

// The tasks of one pass over a batch, as (call, the call's task) pairs in
// the order the pool takes them: the calls with the costliest tasks first,
// so that cheap ones fill the tail where threads run out of work.
class PassTasks {
 public:
  // tasks[i]: call i's task count; cost[i]: what one of its tasks reads.
  PassTasks(const std::vector<int64_t>& tasks, const std::vector<double>& cost) {
    for (size_t i = 0; i < tasks.size(); ++i)
      if (tasks[i] > 0) order_.push_back(i);
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
    for (size_t i : order_) {
      first_.push_back(total_);
      total_ += tasks[i];
    }
  }
  int64_t total() const { return total_; }
  // {call, task within the call} of the pass's task `task`.
  std::pair<size_t, int64_t> Locate(int64_t task) const {
    size_t j = first_.size() - 1;
    while (task < first_[j]) --j;
    return {order_[j], task - first_[j]};
  }

 private:
  std::vector<size_t> order_;
  std::vector<int64_t> first_;
  int64_t total_ = 0;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Offsets into the shared scratch keep every buffer on its own cache lines.
int64_t AlignFloats(int64_t n) { return (n + 15) / 16 * 16; }
int64_t AlignBytes(int64_t n) { return (n + 63) / 64 * 64; }

absl::Status NameExpert(absl::Status status, const ExpertFfnCall& call, bool name_experts) {
  if (status.ok() || !name_experts) return status;
  return absl::Status(status.code(), absl::StrCat("expert ", call.expert, ": ", status.message()));
}

absl::Status CheckCall(const ExpertFfnCall& call, const LinearOptions& options) {
  if (call.weights == nullptr) return absl::InvalidArgumentError("ExpertFfn: no weights");
  const ExpertFfnWeights& weights = *call.weights;
  const int64_t hidden = weights.w1.k;
  const int64_t intermediate = weights.w1.n;
  if (call.rows < 0) return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: negative rows ", call.rows));
  if (hidden < 1 || intermediate < 1)
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: gate_proj is [", intermediate, ", ", hidden, "]"));
  TANDEM_RETURN_IF_ERROR(CheckWeight(weights.w1, "gate_proj", intermediate, hidden));
  TANDEM_RETURN_IF_ERROR(CheckWeight(weights.w3, "up_proj", intermediate, hidden));
  TANDEM_RETURN_IF_ERROR(CheckWeight(weights.w2, "down_proj", hidden, intermediate));
  if (options.kernel != nullptr && options.kernel->isa > ActiveIsa())
    return absl::FailedPreconditionError(
        absl::StrCat("ExpertFfn: kernel ", options.kernel->name, ": ", IsaUnavailableReason(options.kernel->isa)));
  if (call.rows > 0 && (call.x == nullptr || call.y == nullptr))
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: null x or y for ", call.rows, " rows"));
  return absl::OkStatus();
}

}  // namespace

ExpertFfn::ExpertFfn(ThreadPool* pool, LinearOptions options) : pool_(pool), options_(options) {}

absl::Status ExpertFfn::Run(const ExpertFfnWeights& weights, const float* x, int64_t rows, float* y) {
  const ExpertFfnCall call{.weights = &weights, .x = x, .rows = rows, .y = y};
  return RunCalls(std::span<const ExpertFfnCall>(&call, 1), /*name_experts=*/false);
}

absl::Status ExpertFfn::Run(std::span<const ExpertFfnCall> calls) { return RunCalls(calls, /*name_experts=*/true); }

absl::Status ExpertFfn::RunCalls(std::span<const ExpertFfnCall> calls, bool name_experts) {
  for (const ExpertFfnCall& call : calls)
    TANDEM_RETURN_IF_ERROR(NameExpert(CheckCall(call, options_), call, name_experts));
  TANDEM_RETURN_IF_ERROR(PlanCalls(calls));
  TANDEM_RETURN_IF_ERROR(PrepareInputs(calls, name_experts));
  TANDEM_RETURN_IF_ERROR(GateUpPass(calls, name_experts));
  return DownPass(calls, name_experts);
}

absl::Status ExpertFfn::PlanCalls(std::span<const ExpertFfnCall> calls) {
  const int threads = pool_ == nullptr ? 1 : pool_->num_threads();
  plans_.resize(calls.size());
  int64_t floats = 0, bytes = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const ExpertFfnCall& call = calls[i];
    CallPlan& plan = plans_[i];
    plan = CallPlan{};
    if (call.rows == 0) continue;
    const ExpertFfnWeights& w = *call.weights;
    const int64_t rows = call.rows, hidden = w.w1.k, intermediate = w.w1.n;
    plan.gate_kernel = &ChooseLinearKernel(rows, w.w1.dtype, options_);
    plan.up_kernel = &ChooseLinearKernel(rows, w.w3.dtype, options_);
    plan.down_kernel = &ChooseLinearKernel(rows, w.w2.dtype, options_);
    // Activations the stream and packed kernels read get row strides that
    // do not alias in L1 (see ActivationRowStride): a copy of x, and the
    // [R, I] intermediates.
    plan.ldx = rows > 1 ? ActivationRowStride(hidden) : hidden;
    plan.ldh = rows > 1 ? ActivationRowStride(intermediate) : intermediate;
    if (plan.ldx != hidden &&
        (ReadsF32Rows(*plan.gate_kernel, rows, hidden) || ReadsF32Rows(*plan.up_kernel, rows, hidden))) {
      plan.x_at = floats;
      floats += AlignFloats(rows * plan.ldx);
    }
    plan.gate_at = floats;
    floats += AlignFloats(rows * plan.ldh);
    plan.up_at = floats;
    floats += AlignFloats(rows * plan.ldh);
    plan.x_prepared_at = bytes;
    bytes += AlignBytes(PreparedInputBytes(*plan.gate_kernel, rows, hidden));
    plan.up_prepared_at = plan.x_prepared_at;  // the same layout when the kernels are the same
    if (plan.up_kernel != plan.gate_kernel) {
      plan.up_prepared_at = bytes;
      bytes += AlignBytes(PreparedInputBytes(*plan.up_kernel, rows, hidden));
    }
    plan.h_prepared_at = bytes;
    bytes += AlignBytes(PreparedInputBytes(*plan.down_kernel, rows, intermediate));
    plan.gate_features = LinearTaskFeatures(rows, w.w1, threads, *plan.gate_kernel);
    plan.down_features = LinearTaskFeatures(rows, w.w2, threads, *plan.down_kernel);
  }
  TANDEM_RETURN_IF_ERROR(floats_.Grow(floats, "ExpertFfn's activations (x copies, gate and up)"));
  if (bytes > 0 && prepared_.Reserve(static_cast<size_t>(bytes)) == nullptr)
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory for ExpertFfn's prepared inputs (", bytes, " bytes for ", calls.size(), " experts)"));
  return absl::OkStatus();
}

// Each call's x: copied to its strided rows, and in its kernels' layouts.
absl::Status ExpertFfn::PrepareInputs(std::span<const ExpertFfnCall> calls, bool name_experts) {
  uint8_t* prepared = static_cast<uint8_t*>(prepared_.data());
  for (size_t i = 0; i < calls.size(); ++i) {
    const ExpertFfnCall& call = calls[i];
    const CallPlan& plan = plans_[i];
    if (call.rows == 0) continue;
    const int64_t hidden = call.weights->w1.k;
    if (plan.x_at >= 0)
      for (int64_t r = 0; r < call.rows; ++r)
        std::memcpy(floats_.data() + plan.x_at + r * plan.ldx, call.x + r * hidden, hidden * sizeof(float));
    TANDEM_RETURN_IF_ERROR(NameExpert(
        PrepareInputInto(*plan.gate_kernel, call.x, hidden, call.rows, hidden, pool_, prepared + plan.x_prepared_at),
        call, name_experts));
    if (plan.up_kernel != plan.gate_kernel)
      TANDEM_RETURN_IF_ERROR(NameExpert(
          PrepareInputInto(*plan.up_kernel, call.x, hidden, call.rows, hidden, pool_, prepared + plan.up_prepared_at),
          call, name_experts));
  }
  return absl::OkStatus();
}

// Gate and up in one parallel pass over every call's I: a task owns features
// [n0, n1) of both, so W1 and W3 stream back to back and silu(g) * u is
// applied while the slice is still in cache, without another pass over [R, I].
absl::Status ExpertFfn::GateUpPass(std::span<const ExpertFfnCall> calls, bool name_experts) {
  std::vector<int64_t> tasks(calls.size(), 0);
  std::vector<double> cost(calls.size(), 0.0);
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].rows == 0) continue;
    const LinearWeight& w1 = calls[i].weights->w1;
    tasks[i] = CeilDiv(w1.n, plans_[i].gate_features);
    cost[i] = static_cast<double>(calls[i].rows) * static_cast<double>(plans_[i].gate_features * w1.row_bytes());
  }
  const PassTasks pass(tasks, cost);
  const uint8_t* prepared = static_cast<const uint8_t*>(prepared_.data());
  return ParallelTasks(pool_, pass.total(), [&](int64_t task) {
    const auto [i, t] = pass.Locate(task);
    const ExpertFfnCall& call = calls[i];
    const CallPlan& plan = plans_[i];
    const ExpertFfnWeights& w = *call.weights;
    float* gate = floats_.data() + plan.gate_at;  // [R, ldh]: gate, then silu(gate) * up in place
    float* up = floats_.data() + plan.up_at;      // [R, ldh]
    LinearSliceArgs args{.x = plan.x_at >= 0 ? floats_.data() + plan.x_at : call.x,
                         .ldx = plan.x_at >= 0 ? plan.ldx : w.w1.k,
                         .m = call.rows,
                         .n_begin = t * plan.gate_features,
                         .n_end = std::min((t + 1) * plan.gate_features, w.w1.n),
                         .y = gate,
                         .ldy = plan.ldh,
                         .prepared = prepared + plan.x_prepared_at};
    TANDEM_RETURN_IF_ERROR(NameExpert(LinearSlice(*plan.gate_kernel, w.w1, args), call, name_experts));
    args.y = up;
    args.prepared = prepared + plan.up_prepared_at;
    TANDEM_RETURN_IF_ERROR(NameExpert(LinearSlice(*plan.up_kernel, w.w3, args), call, name_experts));
    for (int64_t r = 0; r < call.rows; ++r)
      SiluMul(gate + r * plan.ldh + args.n_begin, up + r * plan.ldh + args.n_begin, args.n_end - args.n_begin);
    return absl::OkStatus();
  });
}

// Down: [R, I] . W2[D, I]^T -> y [R, D], every call's h prepared first.
absl::Status ExpertFfn::DownPass(std::span<const ExpertFfnCall> calls, bool name_experts) {
  uint8_t* prepared = static_cast<uint8_t*>(prepared_.data());
  std::vector<int64_t> tasks(calls.size(), 0);
  std::vector<double> cost(calls.size(), 0.0);
  for (size_t i = 0; i < calls.size(); ++i) {
    const ExpertFfnCall& call = calls[i];
    const CallPlan& plan = plans_[i];
    if (call.rows == 0) continue;
    const LinearWeight& w2 = call.weights->w2;
    TANDEM_RETURN_IF_ERROR(NameExpert(PrepareInputInto(*plan.down_kernel, floats_.data() + plan.gate_at, plan.ldh,
                                                       call.rows, w2.k, pool_, prepared + plan.h_prepared_at),
                                      call, name_experts));
    tasks[i] = CeilDiv(w2.n, plan.down_features);
    cost[i] = static_cast<double>(call.rows) * static_cast<double>(plan.down_features * w2.row_bytes());
  }
  const PassTasks pass(tasks, cost);
  return ParallelTasks(pool_, pass.total(), [&](int64_t task) {
    const auto [i, t] = pass.Locate(task);
    const ExpertFfnCall& call = calls[i];
    const CallPlan& plan = plans_[i];
    const LinearWeight& w2 = call.weights->w2;
    const LinearSliceArgs args{.x = floats_.data() + plan.gate_at,
                               .ldx = plan.ldh,
                               .m = call.rows,
                               .n_begin = t * plan.down_features,
                               .n_end = std::min((t + 1) * plan.down_features, w2.n),
                               .y = call.y,
                               .ldy = w2.n,
                               .prepared = prepared + plan.h_prepared_at};
    return NameExpert(LinearSlice(*plan.down_kernel, w2, args), call, name_experts);
  });
}

}  // namespace tandem
