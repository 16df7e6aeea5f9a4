// A GGUF checkpoint (one file or a split set) seen through Hugging Face's
// names and shapes (gguf_names.h), so LoadModelWeights, fingerprints and the
// float64 reference read it as they read a safetensors folder:
//
//   - matrices are views into the mapped file, in their stored type (F32,
//     F16, BF16 or a ggml block type); a stacked expert tensor
//     blk.l.ffn_*_exps {K, N, E} is E views, expert e at e * N rows, no copy
//     (older files with one tensor per expert are read the same way);
//   - q_proj / k_proj of a "llama" file are stored with rows permuted into
//     llama.cpp's interleaved RoPE order; their rows are put back in Hugging
//     Face order once at load, in their stored type (rows are independent,
//     also when quantized), into buffers this source owns: ~1.5% of
//     Mixtral's bytes, and the attention code stays the one Hugging Face
//     layout everywhere (CPU and CUDA);
//   - vectors (norms, biases) are handed out as F32;
//   - quantized matrices stay views of their blocks (kKeep; the CPU linear
//     kernels run them, common/kernels/linear_quantized.h, and the CPU
//     backend's embedding decodes a row's blocks per token), or only the
//     experts' do and the other matrices are dequantized to BF16 at load
//     (kKeepExperts: for the CUDA backend, whose dense code is float only),
//     or only the dense ones do (kKeepDense: the experts in BF16 for the
//     CUDA pool), or all are dequantized (kDequantizeTo*), only for the
//     experts the process needs. A consumer that cannot compute a quantized
//     matrix refuses it by name (RequireFloatDType).
//
// Errors name the file and the GGUF tensor: a missing tensor (NotFound), a
// shape the config does not imply, a row that is not whole blocks, or a type
// tandem does not run, e.g. iq2_xxs (InvalidArgument).
// Owns the checkpoint and the buffers; immutable after Create, so any thread
// may call its const methods.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"
#include "common/platform/huge_page_arena.h"

namespace tandem {

enum class QuantizedWeights {
  kKeep,              // views of the stored blocks
  kKeepExperts,       // the experts' blocks kept (the quantized CPU kernels run them), the rest to BF16
  kKeepDense,         // the dense matrices' blocks kept (embedding, attention, lm_head), the experts to BF16
  kDequantizeToBf16,  // the fallback until quantized kernels exist (logged)
  kDequantizeToF32,   // the same, exactly (tests compare against references)
};
std::string_view QuantizedWeightsName(QuantizedWeights mode);
// Whether `mode` leaves the experts in their blocks (kKeep, kKeepExperts).
bool ExpertsKeptQuantized(QuantizedWeights mode);
// The mode for the experts' and the dense matrices' choices (true = blocks kept).
QuantizedWeights QuantizedWeightsFor(bool experts_quantized, bool dense_quantized);

struct GgufSourceOptions {
  QuantizedWeights quantized = QuantizedWeights::kDequantizeToBf16;
  // Which experts the dequantizing fallback materialises; the others keep
  // name, dtype and shape with data == nullptr (as SyntheticTensorSource's).
  // Kept (views) experts ignore it: mapped pages never read take no memory.
  SyntheticExperts experts;
  int num_threads = 1;  // for the fallback's dequantization and the copy
  // Copy the tensors it serves from the file (pread, num_threads at once)
  // into anonymous memory advised for 2 MiB pages (HugePageArena), as long
  // as the copies fit in `copy_budget_bytes`; the rest stay views of the
  // mapping. Experts the process does not need (`experts`) are never
  // copied. For processes whose kernels stream the weights (in-process CPU
  // experts and attention); costs the load a copy, not the page cache.
  bool copy_to_memory = false;
  int64_t copy_budget_bytes = 0;
  // kGroupMajor: the Q4_K and Q6_K matrices this source holds copies of
  // (copy_to_memory, or q/k rows put back in order) are put in the VNNI
  // GEMV's order (block_order.h) and their views say so; the token
  // embedding, and what stays mapped, keep ggml's. For a process whose
  // kernels prefer it (PreferredBlockOrder, linear.h).
  BlockOrder block_order = BlockOrder::kGgml;
};

// The ggml type stored as this DType, and back (InvalidArgument naming the
// type, and listing what tandem runs, for the others).
absl::StatusOr<DType> DTypeFromGgml(GgmlType type);
GgmlType GgmlFromDType(DType dtype);

class GgufTensorSource : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<GgufTensorSource>> Create(std::unique_ptr<GgufCheckpoint> checkpoint,
                                                                  const ModelConfig& config,
                                                                  const GgufSourceOptions& options);

  absl::StatusOr<TensorView> Get(const std::string& name) const override;
  // The file's type, whatever --gguf_experts / --gguf_dense made of it.
  absl::StatusOr<DType> StoredDType(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  std::string Describe() const override { return checkpoint_->Describe(); }

  const GgufCheckpoint& checkpoint() const { return *checkpoint_; }
  // The GGUF tensor behind a Hugging Face name ("" when none).
  std::string GgufNameOf(const std::string& hf_name) const;
  // "q4_K: 64 tensors, 1.20 GB; q6_K: ...; f32: ..." over the file's tensors.
  std::string StoredTypesSummary() const;
  // The fallback's work: quantized tensors dequantized at load and their
  // bytes after it (0 when none or kKeep).
  int64_t dequantized_tensors() const { return dequantized_tensors_; }
  int64_t dequantized_bytes() const { return dequantized_bytes_; }
  bool per_expert_layout() const { return per_expert_layout_; }
  // Bytes copied out of the mapping (copy_to_memory), and bytes left mapped
  // because the budget ran out; with the arena's size, for the load log.
  int64_t copied_bytes() const { return copied_bytes_; }
  int64_t left_mapped_bytes() const { return left_mapped_bytes_; }
  const HugePageArena& arena() const { return arena_; }
  // Matrices put in group-major order (GgufSourceOptions::block_order),
  // their bytes and the seconds it took, for the load log.
  int64_t reordered_tensors() const { return reordered_tensors_; }
  int64_t reordered_bytes() const { return reordered_bytes_; }
  double reorder_seconds() const { return reorder_seconds_; }

 private:
  GgufTensorSource() = default;
  struct Planned;
  absl::Status Bind(const ModelConfig& config, const GgufSourceOptions& options);
  absl::StatusOr<TensorView> JoinSplitKvB(const ModelConfig& config, const WeightSpec& w);
  uint8_t* Own(size_t bytes);

  std::unique_ptr<GgufCheckpoint> checkpoint_;
  std::map<std::string, TensorView> views_;
  std::map<std::string, std::string> gguf_names_;
  std::map<std::string, DType> stored_dtypes_;       // matrices only; vectors are F32 views
  HugePageArena arena_;                              // what it owns, in huge pages where it can
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;  // what the arena could not map
  int64_t dequantized_tensors_ = 0;
  int64_t dequantized_bytes_ = 0;
  int64_t copied_bytes_ = 0;
  int64_t left_mapped_bytes_ = 0;
  int64_t reordered_tensors_ = 0;
  int64_t reordered_bytes_ = 0;
  double reorder_seconds_ = 0;
  bool per_expert_layout_ = false;
};

}  // namespace tandem
