// Legend as in expert_ffn.h: R rows, D hidden size, I intermediate size.
#include "cpu_worker/expert_ffn.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/parallel_status.h"
#include "common/base/status_macros.h"
#include "common/kernels/vector_exp.h"

namespace tandem {
namespace {

// gate[j] = silu(gate[j]) * up[j] = gate * up / (1 + exp(-gate)), in place.
void SiluMul(float* gate, const float* up, int64_t count) {
  int64_t j = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; j + 8 <= count; j += 8) {
    const __m256 g = _mm256_loadu_ps(gate + j);
    const __m256 e = ExpAvx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 h = _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + j)), _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + j, h);
  }
  for (; j < count; ++j) gate[j] = gate[j] * up[j] / (1.0f + std::exp(-gate[j]));
}

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

}  // namespace

ExpertFfn::ExpertFfn(ThreadPool* pool, LinearOptions options) : pool_(pool), options_(options) {}

absl::Status ExpertFfn::Run(const ExpertFfnWeights& weights, const float* x, int64_t rows, float* y) {
  const int64_t hidden = weights.w1.k;
  const int64_t intermediate = weights.w1.n;
  if (rows < 0) return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: negative rows ", rows));
  if (hidden < 1 || intermediate < 1)
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: gate_proj is [", intermediate, ", ", hidden, "]"));
  TANDEM_RETURN_IF_ERROR(CheckWeight(weights.w1, "gate_proj", intermediate, hidden));
  TANDEM_RETURN_IF_ERROR(CheckWeight(weights.w3, "up_proj", intermediate, hidden));
  TANDEM_RETURN_IF_ERROR(CheckWeight(weights.w2, "down_proj", hidden, intermediate));
  if (options_.kernel != nullptr && options_.kernel->isa > ActiveIsa())
    return absl::FailedPreconditionError(
        absl::StrCat("ExpertFfn: kernel ", options_.kernel->name, ": ", IsaUnavailableReason(options_.kernel->isa)));
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: null x or y for ", rows, " rows"));

  const LinearKernel& gate_kernel = ChooseLinearKernel(rows, weights.w1.dtype, options_);
  const LinearKernel& up_kernel = ChooseLinearKernel(rows, weights.w3.dtype, options_);
  const LinearKernel& down_kernel = ChooseLinearKernel(rows, weights.w2.dtype, options_);

  // Activations the stream and packed kernels read get row strides that do
  // not alias in L1 (see ActivationRowStride): a copy of x, and the [R, I]
  // intermediates.
  const int64_t ldx = rows > 1 ? ActivationRowStride(hidden) : hidden;
  const int64_t ldh = rows > 1 ? ActivationRowStride(intermediate) : intermediate;
  if (ldx != hidden) TANDEM_RETURN_IF_ERROR(x_.Grow(rows * ldx, "ExpertFfn's strided copy of x"));
  TANDEM_RETURN_IF_ERROR(gate_.Grow(rows * ldh, "ExpertFfn's gate activations"));
  TANDEM_RETURN_IF_ERROR(up_.Grow(rows * ldh, "ExpertFfn's up activations"));
  const float* xs = x;
  if (ldx != hidden && (ReadsF32Rows(gate_kernel, rows, hidden) || ReadsF32Rows(up_kernel, rows, hidden))) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(x_.data() + r * ldx, x + r * hidden, hidden * sizeof(float));
    xs = x_.data();
  }
  // Kernels with a layout of their own get x prepared once, for all tasks.
  TANDEM_RETURN_IF_ERROR(x_prepared_.Prepare(gate_kernel, x, hidden, rows, hidden, pool_));
  if (&up_kernel != &gate_kernel)
    TANDEM_RETURN_IF_ERROR(up_prepared_.Prepare(up_kernel, x, hidden, rows, hidden, pool_));
  const void* up_prepared = &up_kernel == &gate_kernel ? x_prepared_.data() : up_prepared_.data();
  float* gate = gate_.data();  // [R, ldh]: gate, then silu(gate) * up in place
  float* up = up_.data();      // [R, ldh]

  // Gate and up in one parallel pass over I: a task owns features [n0, n1) of
  // both, so W1 and W3 stream back to back and silu(g) * u is applied while
  // the slice is still in cache, without another pass over [R, I].
  const int threads = pool_ == nullptr ? 1 : pool_->num_threads();
  const int64_t gate_features = LinearTaskFeatures(rows, weights.w1, threads, gate_kernel);
  TANDEM_RETURN_IF_ERROR(ParallelTasks(pool_, (intermediate + gate_features - 1) / gate_features, [&](int64_t t) {
    LinearSliceArgs args{.x = xs,
                         .ldx = ldx,
                         .m = rows,
                         .n_begin = t * gate_features,
                         .n_end = std::min((t + 1) * gate_features, intermediate),
                         .y = gate,
                         .ldy = ldh,
                         .prepared = x_prepared_.data()};
    TANDEM_RETURN_IF_ERROR(LinearSlice(gate_kernel, weights.w1, args));
    args.y = up;
    args.prepared = up_prepared;
    TANDEM_RETURN_IF_ERROR(LinearSlice(up_kernel, weights.w3, args));
    for (int64_t r = 0; r < rows; ++r)
      SiluMul(gate + r * ldh + args.n_begin, up + r * ldh + args.n_begin, args.n_end - args.n_begin);
    return absl::OkStatus();
  }));

  // Down: [R, I] . W2[D, I]^T -> y [R, D].
  TANDEM_RETURN_IF_ERROR(h_prepared_.Prepare(down_kernel, gate, ldh, rows, intermediate, pool_));
  const int64_t down_features = LinearTaskFeatures(rows, weights.w2, threads, down_kernel);
  return ParallelTasks(pool_, (hidden + down_features - 1) / down_features, [&](int64_t t) {
    const LinearSliceArgs args{.x = gate,
                               .ldx = ldh,
                               .m = rows,
                               .n_begin = t * down_features,
                               .n_end = std::min((t + 1) * down_features, hidden),
                               .y = y,
                               .ldy = hidden,
                               .prepared = h_prepared_.data()};
    return LinearSlice(down_kernel, weights.w2, args);
  });
}

}  // namespace tandem
