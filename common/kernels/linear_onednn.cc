// Legend as in linear.h: M rows, K input features, N output features.
#include "common/kernels/linear_onednn.h"

#include <dlfcn.h>
#include <immintrin.h>

#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/cpu_features.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "dnnl.hpp"

namespace tandem {
namespace {

// oneDNN picks its own kernels from what the CPU reports; cap it at the
// level tandem's kernels run at, so TANDEM_MAX_ISA / --max_isa mean the same
// for both. Only effective before oneDNN's first primitive, hence once.
void CapOneDnnIsa() {
  static std::once_flag once;
  std::call_once(once, [] {
    dnnl::cpu_isa isa = dnnl::cpu_isa::avx2;
    switch (ActiveIsa()) {
      case IsaLevel::kAvx2: isa = dnnl::cpu_isa::avx2; break;
      case IsaLevel::kAvx512: isa = dnnl::cpu_isa::avx512_core; break;
      case IsaLevel::kAvx512Vnni: isa = dnnl::cpu_isa::avx512_core_vnni; break;
      case IsaLevel::kAvx512Bf16: isa = dnnl::cpu_isa::avx512_core_bf16; break;
      case IsaLevel::kAmx: isa = dnnl::cpu_isa::avx512_core_amx; break;
    }
    try {
      dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error& e) {
      LOG_DEBUG("oneDNN: set_max_cpu_isa: ", e.what());
    }
  });
}

// ---------------------------------------------------------------------------
// oneDNN path: W tile -> f32 thread-local buffer -> single-threaded matmul.
// ---------------------------------------------------------------------------

// Debian's libdnnl is built with OpenMP (ldd shows libgomp): each primitive
// would fork an OpenMP team of omp_get_max_threads() (= all cores) from every
// one of our pool threads, oversubscribing the cores our pool already owns.
// nthreads-var is a per-thread ICV, so we set it to 1 on the calling thread
// for the duration of our oneDNN calls (primitive creation reads it too).
// tandem does not link libgomp itself (CMake links only libdnnl), so the
// functions are looked up in the already-loaded libgomp; when oneDNN uses
// another runtime they are absent and there is nothing to do.
class ScopedOmpSingleThread {
 public:
  ScopedOmpSingleThread() {
    const Api& api = GetApi();
    if (api.set == nullptr || api.get == nullptr) return;
    previous_ = api.get();
    if (previous_ != 1) api.set(1);
  }
  ~ScopedOmpSingleThread() {
    if (previous_ > 1) GetApi().set(previous_);
  }
  ScopedOmpSingleThread(const ScopedOmpSingleThread&) = delete;
  ScopedOmpSingleThread& operator=(const ScopedOmpSingleThread&) = delete;

 private:
  struct Api {
    void (*set)(int) = nullptr;
    int (*get)() = nullptr;
  };
  static const Api& GetApi() {
    static const Api api = [] {
      Api a;
      a.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
      a.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
      return a;
    }();
    return api;
  }
  int previous_ = 0;
};

struct MatmulKey {
  int64_t m, n, k, ldx, ldy;
  bool bias;
  bool operator==(const MatmulKey& o) const {
    return m == o.m && n == o.n && k == o.k && ldx == o.ldx && ldy == o.ldy && bias == o.bias;
  }
  template <typename H>
  friend H AbslHashValue(H h, const MatmulKey& key) {
    return H::combine(std::move(h), key.m, key.n, key.k, key.ldx, key.ldy, key.bias);
  }
};

// A matmul for one (M, tile width, K, ldx, ldy, bias) and memory objects whose
// data handles are repointed on every call.
struct MatmulEntry {
  dnnl::matmul primitive;
  dnnl::memory src, weights, bias, dst;
};

// Weights are fixed and rows vary, so every thread caches primitives by shape;
// a prefill of a new length adds an entry. The cap bounds memory when many
// distinct lengths go by (creating one costs little next to the matmul).
constexpr size_t kMaxCachedPrimitives = 256;

// Everything oneDNN needs on one of our threads. Streams are not thread-safe
// and each thread has its own tile buffer, so the whole context is per-thread.
class OneDnnThreadContext {
 public:
  static absl::StatusOr<OneDnnThreadContext*> Get() {
    CapOneDnnIsa();
    thread_local std::unique_ptr<OneDnnThreadContext> context;
    if (context == nullptr) {
      try {
        context = std::make_unique<OneDnnThreadContext>();
      } catch (const dnnl::error& e) {
        return absl::InternalError(absl::StrCat("oneDNN CPU engine/stream creation failed: ", e.what()));
      }
    }
    return context.get();
  }

  OneDnnThreadContext() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  // The f32 copy of one W tile; grown, never shrunk.
  float* Tile(size_t elements) {
    if (tile_.size() < elements) tile_.resize(elements);
    return tile_.data();
  }

  // Throws dnnl::error; the caller converts.
  MatmulEntry& Matmul(const MatmulKey& key) {
    auto it = primitives_.find(key);
    if (it != primitives_.end()) return it->second;
    if (primitives_.size() >= kMaxCachedPrimitives) primitives_.clear();
    using dims = dnnl::memory::dims;
    using dt = dnnl::memory::data_type;
    // x [M, K] of a [M, ldx] matrix; the tile [n, K] row-major read as [K, n]
    // (strides 1, K); y's columns [n0, n0 + n) of a [M, ldy] matrix.
    const dnnl::memory::desc src_md({key.m, key.k}, dt::f32, dims{key.ldx, 1});
    const dnnl::memory::desc weights_md({key.k, key.n}, dt::f32, dims{1, key.k});
    const dnnl::memory::desc dst_md({key.m, key.n}, dt::f32, dims{key.ldy, 1});
    const dnnl::memory::desc bias_md({1, key.n}, dt::f32, dims{key.n, 1});
    const dnnl::matmul::desc desc = key.bias ? dnnl::matmul::desc(src_md, weights_md, bias_md, dst_md)
                                             : dnnl::matmul::desc(src_md, weights_md, dst_md);
    const dnnl::matmul::primitive_desc pd(desc, engine_);
    LOG_DEBUG("oneDNN matmul [", key.m, ", ", key.k, "] x [", key.k, ", ", key.n, "]: ", pd.impl_info_str());
    MatmulEntry entry;
    entry.primitive = dnnl::matmul(pd);
    entry.src = dnnl::memory(src_md, engine_, nullptr);
    entry.weights = dnnl::memory(weights_md, engine_, nullptr);
    entry.dst = dnnl::memory(dst_md, engine_, nullptr);
    if (key.bias) entry.bias = dnnl::memory(bias_md, engine_, nullptr);
    return primitives_.emplace(key, std::move(entry)).first->second;
  }

  dnnl::stream& stream() { return stream_; }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  absl::flat_hash_map<MatmulKey, MatmulEntry> primitives_;
  std::vector<float> tile_;
};

// dst[i] = src[i] as f32 (f16 or bf16 source).
void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst) {
  const auto* p = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const __m256 v = dtype == DType::kF16 ? _mm256_cvtph_ps(raw)
                                          : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    _mm256_storeu_ps(dst + i, v);
  }
  for (; i < count; ++i) dst[i] = LoadAsF32(src, dtype, i);
}

const float* WeightRowF32(const LinearWeight& w, int64_t row) { return static_cast<const float*>(w.data) + row * w.k; }
const void* WeightRow16(const LinearWeight& w, int64_t row) { return static_cast<const uint16_t*>(w.data) + row * w.k; }

}  // namespace

absl::Status OneDnnSlice(const LinearWeight& w, const LinearSliceArgs& a) {
  const int64_t n_begin = a.n_begin, n = a.n_end - a.n_begin, k = w.k, m = a.m;
  const float* bias = a.bias;
  ScopedOmpSingleThread single_thread;
  TANDEM_ASSIGN_OR_RETURN(OneDnnThreadContext * context, OneDnnThreadContext::Get());
  try {
    // F32 weights are used in place; F16/BF16 tiles are widened once per call,
    // which costs K*n element copies against 2*M*K*n flops of matmul.
    const float* tile = nullptr;
    if (w.dtype == DType::kF32) {
      tile = WeightRowF32(w, n_begin);
    } else {
      float* buffer = context->Tile(static_cast<size_t>(n * k));
      ConvertToF32(WeightRow16(w, n_begin), w.dtype, n * k, buffer);
      tile = buffer;
    }
    MatmulEntry& entry = context->Matmul({m, n, k, a.ldx, a.ldy, bias != nullptr});
    entry.src.set_data_handle(const_cast<float*>(a.x));
    entry.weights.set_data_handle(const_cast<float*>(tile));
    entry.dst.set_data_handle(a.y + n_begin);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, entry.src}, {DNNL_ARG_WEIGHTS, entry.weights}, {DNNL_ARG_DST, entry.dst}};
    if (bias != nullptr) {
      entry.bias.set_data_handle(const_cast<float*>(bias + n_begin));
      args.emplace(DNNL_ARG_BIAS, entry.bias);
    }
    entry.primitive.execute(context->stream(), args);
    context->stream().wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN f32 matmul [", m, ", ", k, "] x [", k, ", ", n, "] (",
                                            std::string(DTypeName(w.dtype)), " weights) failed: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory for the f32 tile of W [", n, ", ", k, "]"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
