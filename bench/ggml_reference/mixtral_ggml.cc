// mixtral_ggml: a Mixtral forward pass written on ggml's public API, so that
// tandem can be measured beside the CPU kernels llama.cpp runs (ggml is
// llama.cpp's tensor library) on the very same GGUF file, and its greedy
// tokens and log-probabilities checked against an implementation tandem
// shares no code with. Not part of tandem's build: bench/ggml_reference/build.sh
// compiles it against a ggml source tree (docs/BENCHMARKS.md, "Against ggml").
//
// The graph follows the public architecture (Mixtral as llama.cpp's converter
// writes it: "llama" with expert_count, stacked ffn_*_exps, q/k rows in the
// interleaved RoPE order, so RoPE mode 0), with llama.cpp's defaults where a
// choice changes speed: f16 KV cache, flash attention, logits of the last
// prompt token only, one persistent scratch buffer, prompts prefilled in
// micro-batches of at most --ubatch tokens (512, llama.cpp's n_ubatch).
//
//   mixtral_ggml --model F.gguf --prompt_ids 1,2,3 -n 32 --threads 2
//   mixtral_ggml --model F.gguf --prompt_tokens 512 -n 32 --reps 2
// One JSON object on stdout: prefill and decode tokens/s (best of --reps),
// the greedy tokens and each one's log-probability (of the first rep).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "mixtral_ggml: %s\n", message.c_str());
  std::exit(1);
}

struct Options {
  std::string model;
  std::vector<int32_t> prompt_ids;
  int prompt_tokens = 0;  // > 0: that many ids, deterministic, instead of --prompt_ids
  int decode_tokens = 32;
  int threads = 2;
  int reps = 1;
  int ubatch = 512;  // prompt tokens per forward pass
  bool mmap = true;  // llama.cpp's default: weights read from the page cache
};

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model") {
      options.model = value;
    } else if (flag == "--prompt_ids") {
      for (size_t at = 0; at < value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        options.prompt_ids.push_back(std::atoi(value.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else if (flag == "--prompt_tokens") {
      options.prompt_tokens = std::atoi(value.c_str());
    } else if (flag == "-n" || flag == "--decode_tokens") {
      options.decode_tokens = std::atoi(value.c_str());
    } else if (flag == "--threads") {
      options.threads = std::atoi(value.c_str());
    } else if (flag == "--mmap") {
      options.mmap = value != "0";
    } else if (flag == "--reps") {
      options.reps = std::atoi(value.c_str());
    } else if (flag == "--ubatch") {
      options.ubatch = std::atoi(value.c_str());
    } else {
      Die("unknown flag " + flag);
    }
  }
  if (options.model.empty()) Die("--model F.gguf is required");
  if (options.threads < 1 || options.reps < 1 || options.ubatch < 1 || options.decode_tokens < 0) {
    Die("--threads, --reps, --ubatch must be >= 1 and -n >= 0");
  }
  return options;
}

// The hyperparameters the graph needs, from the GGUF's llama.* keys.
struct Hparams {
  int n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_rot = 0;
  int n_expert = 0, n_expert_used = 0, n_vocab = 0;
  float rope_base = 10000.0f, rms_eps = 1e-5f;
};

uint32_t KeyU32(const gguf_context* gguf, const std::string& key) {
  const int64_t id = gguf_find_key(gguf, key.c_str());
  if (id < 0) Die("GGUF key " + key + " is missing");
  return gguf_get_val_u32(gguf, id);
}

float KeyF32(const gguf_context* gguf, const std::string& key, float fallback) {
  const int64_t id = gguf_find_key(gguf, key.c_str());
  return id < 0 ? fallback : gguf_get_val_f32(gguf, id);
}

struct Layer {
  ggml_tensor *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *router;
  ggml_tensor *gate_exps, *up_exps, *down_exps;
  ggml_tensor *k_cache, *v_cache;
};

struct Model {
  Hparams hp;
  ggml_context* weights = nullptr;  // every tensor of the file, mapped (--mmap 1) or read into memory
  ggml_context* cache = nullptr;    // the f16 KV cache
  ggml_tensor *tok_embd = nullptr, *output_norm = nullptr, *output = nullptr;
  std::vector<Layer> layers;
  int n_ctx = 0;
};

ggml_tensor* Tensor(ggml_context* ctx, const std::string& name) {
  ggml_tensor* t = ggml_get_tensor(ctx, name.c_str());
  if (t == nullptr) Die("tensor " + name + " is missing (stacked experts ffn_*_exps expected)");
  return t;
}

// With `map`, the tensors point into a read-only mapping of the file (as
// llama.cpp's default); otherwise ggml reads them into its own memory.
Model Load(const std::string& path, int n_ctx, bool map) {
  Model model;
  gguf_init_params params = {/*no_alloc=*/map, /*ctx=*/&model.weights};
  gguf_context* gguf = gguf_init_from_file(path.c_str(), params);
  if (gguf == nullptr) Die("ggml could not read " + path);
  if (map) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) Die("cannot open " + path);
    void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) Die("cannot map " + path);
    const size_t data = gguf_get_data_offset(gguf);
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf); ++i) {
      ggml_tensor* t = Tensor(model.weights, gguf_get_tensor_name(gguf, i));
      const size_t at = data + gguf_get_tensor_offset(gguf, i);
      if (at + ggml_nbytes(t) > static_cast<size_t>(st.st_size)) Die(path + ": tensor past the end of the file");
      t->data = static_cast<uint8_t*>(base) + at;
    }
  }
  const int64_t arch_id = gguf_find_key(gguf, "general.architecture");
  const std::string arch = arch_id < 0 ? "" : gguf_get_val_str(gguf, arch_id);
  if (arch != "llama") Die(path + ": architecture '" + arch + "', this reference runs llama (Mixtral) only");
  Hparams& hp = model.hp;
  hp.n_embd = KeyU32(gguf, "llama.embedding_length");
  hp.n_ff = KeyU32(gguf, "llama.feed_forward_length");
  hp.n_layer = KeyU32(gguf, "llama.block_count");
  hp.n_head = KeyU32(gguf, "llama.attention.head_count");
  hp.n_head_kv = KeyU32(gguf, "llama.attention.head_count_kv");
  hp.n_expert = KeyU32(gguf, "llama.expert_count");
  hp.n_expert_used = KeyU32(gguf, "llama.expert_used_count");
  const int64_t rot_id = gguf_find_key(gguf, "llama.rope.dimension_count");
  hp.n_rot = rot_id < 0 ? hp.n_embd / hp.n_head : gguf_get_val_u32(gguf, rot_id);
  hp.rope_base = KeyF32(gguf, "llama.rope.freq_base", 10000.0f);
  hp.rms_eps = KeyF32(gguf, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  gguf_free(gguf);

  model.tok_embd = Tensor(model.weights, "token_embd.weight");
  hp.n_vocab = static_cast<int>(model.tok_embd->ne[1]);
  model.output_norm = Tensor(model.weights, "output_norm.weight");
  model.output = ggml_get_tensor(model.weights, "output.weight");
  if (model.output == nullptr) model.output = model.tok_embd;  // tied embeddings

  const int head_dim = hp.n_embd / hp.n_head;
  const size_t cache_bytes = 2ull * hp.n_layer * ggml_row_size(GGML_TYPE_F16, int64_t{head_dim} * hp.n_head_kv) * n_ctx;
  ggml_init_params cache_params = {cache_bytes + 4 * hp.n_layer * ggml_tensor_overhead(), nullptr, false};
  model.cache = ggml_init(cache_params);
  model.n_ctx = n_ctx;
  for (int l = 0; l < hp.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Layer layer = {Tensor(model.weights, b + "attn_norm.weight"),     Tensor(model.weights, b + "attn_q.weight"),
                   Tensor(model.weights, b + "attn_k.weight"),        Tensor(model.weights, b + "attn_v.weight"),
                   Tensor(model.weights, b + "attn_output.weight"),   Tensor(model.weights, b + "ffn_norm.weight"),
                   Tensor(model.weights, b + "ffn_gate_inp.weight"),  Tensor(model.weights, b + "ffn_gate_exps.weight"),
                   Tensor(model.weights, b + "ffn_up_exps.weight"),   Tensor(model.weights, b + "ffn_down_exps.weight"),
                   ggml_new_tensor_2d(model.cache, GGML_TYPE_F16, int64_t{head_dim} * hp.n_head_kv, n_ctx),
                   ggml_new_tensor_2d(model.cache, GGML_TYPE_F16, int64_t{head_dim} * hp.n_head_kv, n_ctx)};
    model.layers.push_back(layer);
  }
  return model;
}

// Attention of n_tokens new tokens at positions n_past.. over the cache.
ggml_tensor* Attention(ggml_context* ctx, ggml_cgraph* gf, const Model& model, const Layer& layer, ggml_tensor* cur,
                       ggml_tensor* positions, ggml_tensor* mask, int n_past, int n_tokens) {
  const Hparams& hp = model.hp;
  const int head_dim = hp.n_embd / hp.n_head;
  ggml_tensor* q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, layer.wq, cur), head_dim, hp.n_head, n_tokens);
  ggml_tensor* k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, layer.wk, cur), head_dim, hp.n_head_kv, n_tokens);
  ggml_tensor* v = ggml_mul_mat(ctx, layer.wv, cur);
  q = ggml_rope_ext(ctx, q, positions, nullptr, hp.n_rot, /*mode=*/0, model.n_ctx, hp.rope_base, 1.0f, 0.0f, 1.0f,
                    32.0f, 1.0f);
  k = ggml_rope_ext(ctx, k, positions, nullptr, hp.n_rot, 0, model.n_ctx, hp.rope_base, 1.0f, 0.0f, 1.0f, 32.0f,
                    1.0f);
  const int64_t kv_width = int64_t{head_dim} * hp.n_head_kv;
  const size_t row = ggml_row_size(GGML_TYPE_F16, kv_width);
  ggml_build_forward_expand(
      gf, ggml_cpy(ctx, ggml_reshape_2d(ctx, k, kv_width, n_tokens),
                   ggml_view_2d(ctx, layer.k_cache, kv_width, n_tokens, row, row * n_past)));
  ggml_build_forward_expand(
      gf, ggml_cpy(ctx, v, ggml_view_2d(ctx, layer.v_cache, kv_width, n_tokens, row, row * n_past)));
  const int n_kv = n_past + n_tokens;
  const size_t head = ggml_row_size(GGML_TYPE_F16, head_dim);
  ggml_tensor* keys = ggml_view_3d(ctx, layer.k_cache, head_dim, n_kv, hp.n_head_kv, row, head, 0);
  ggml_tensor* values = ggml_view_3d(ctx, layer.v_cache, head_dim, n_kv, hp.n_head_kv, row, head, 0);
  ggml_tensor* attn = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), keys, values, mask,
                                          1.0f / std::sqrt(static_cast<float>(head_dim)), 0.0f, 0.0f);
  return ggml_mul_mat(ctx, layer.wo, ggml_reshape_2d(ctx, attn, hp.n_embd, n_tokens));
}

// Router softmax, top-k, renormalised weights, the experts by ggml_mul_mat_id.
ggml_tensor* MoeFfn(ggml_context* ctx, const Model& model, const Layer& layer, ggml_tensor* cur, int n_tokens) {
  const Hparams& hp = model.hp;
  const int k = hp.n_expert_used;
  ggml_tensor* probs = ggml_soft_max(ctx, ggml_mul_mat(ctx, layer.router, cur));  // [n_expert, n_tokens]
  ggml_tensor* selected = ggml_argsort_top_k(ctx, probs, k);                      // [k, n_tokens] i32
  ggml_tensor* weights = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, hp.n_expert, n_tokens), selected);
  weights = ggml_reshape_2d(ctx, weights, k, n_tokens);
  weights = ggml_div(ctx, weights, ggml_sum_rows(ctx, weights));
  weights = ggml_reshape_3d(ctx, weights, 1, k, n_tokens);
  ggml_tensor* x = ggml_reshape_3d(ctx, cur, hp.n_embd, 1, n_tokens);
  ggml_tensor* up = ggml_mul_mat_id(ctx, layer.up_exps, x, selected);      // [n_ff, k, n_tokens]
  ggml_tensor* gate = ggml_mul_mat_id(ctx, layer.gate_exps, x, selected);  // [n_ff, k, n_tokens]
  ggml_tensor* hidden = ggml_mul(ctx, ggml_silu(ctx, gate), up);
  ggml_tensor* experts = ggml_mul(ctx, ggml_mul_mat_id(ctx, layer.down_exps, hidden, selected), weights);
  ggml_tensor* sum = ggml_view_2d(ctx, experts, hp.n_embd, n_tokens, experts->nb[2], 0);
  for (int e = 1; e < k; ++e) {
    sum = ggml_add(ctx, sum, ggml_view_2d(ctx, experts, hp.n_embd, n_tokens, experts->nb[2], e * experts->nb[1]));
  }
  return sum;
}

// One forward step over `tokens` at n_past; returns the last token's logits.
struct Runner {
  const Model& model;
  std::vector<uint8_t> scratch;  // reused by every graph, so its pages are faulted in once
  ggml_threadpool* pool = nullptr;
  int threads;
  std::vector<uint8_t> work;  // the plan's work buffer, likewise kept

  std::vector<float> Forward(const std::vector<int32_t>& tokens, int n_past) {
    const Hparams& hp = model.hp;
    const int n_tokens = static_cast<int>(tokens.size());
    ggml_init_params params = {scratch.size(), scratch.data(), false};
    ggml_context* ctx = ggml_init(params);
    ggml_cgraph* gf = ggml_new_graph_custom(ctx, 8192, false);
    ggml_tensor* ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens);
    std::memcpy(ids->data, tokens.data(), tokens.size() * sizeof(int32_t));
    ggml_tensor* positions = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens);
    for (int i = 0; i < n_tokens; ++i) static_cast<int32_t*>(positions->data)[i] = n_past + i;
    const int n_kv = n_past + n_tokens;
    ggml_tensor* mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_tokens);
    for (int i = 0; i < n_tokens; ++i) {
      for (int j = 0; j < n_kv; ++j) {
        static_cast<ggml_fp16_t*>(mask->data)[int64_t{i} * n_kv + j] =
            ggml_fp32_to_fp16(j <= n_past + i ? 0.0f : -INFINITY);
      }
    }
    ggml_tensor* inp = ggml_get_rows(ctx, model.tok_embd, ids);
    for (const Layer& layer : model.layers) {
      ggml_tensor* cur = ggml_mul(ctx, ggml_rms_norm(ctx, inp, hp.rms_eps), layer.attn_norm);
      ggml_tensor* attn_out = ggml_add(ctx, Attention(ctx, gf, model, layer, cur, positions, mask, n_past, n_tokens), inp);
      cur = ggml_mul(ctx, ggml_rms_norm(ctx, attn_out, hp.rms_eps), layer.ffn_norm);
      inp = ggml_add(ctx, MoeFfn(ctx, model, layer, cur, n_tokens), attn_out);
    }
    ggml_tensor* last = ggml_view_2d(ctx, inp, hp.n_embd, 1, inp->nb[1], (n_tokens - 1) * inp->nb[1]);
    ggml_tensor* logits =
        ggml_mul_mat(ctx, model.output, ggml_mul(ctx, ggml_rms_norm(ctx, last, hp.rms_eps), model.output_norm));
    ggml_build_forward_expand(gf, logits);
    ggml_cplan plan = ggml_graph_plan(gf, threads, pool);
    if (work.size() < plan.work_size) work.assign(plan.work_size, 0);
    plan.work_data = work.data();
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) Die("ggml_graph_compute failed");
    std::vector<float> out(static_cast<const float*>(logits->data), static_cast<const float*>(logits->data) + hp.n_vocab);
    ggml_free(ctx);
    return out;
  }
};

struct Pick {
  int32_t token;
  double logprob;
};

Pick Greedy(const std::vector<float>& logits) {
  const auto best = std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - *best);
  return {static_cast<int32_t>(best - logits.begin()), -std::log(sum)};
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseOptions(argc, argv);
  ggml_cpu_init();
  if (options.prompt_tokens > 0) {
    options.prompt_ids.clear();
    for (int i = 0; i < options.prompt_tokens; ++i) options.prompt_ids.push_back(3 + (i * 7919) % 1990);
  }
  if (options.prompt_ids.empty()) Die("give --prompt_ids or --prompt_tokens");
  const int n_ctx = static_cast<int>(options.prompt_ids.size()) + options.decode_tokens + 1;
  const auto load_start = std::chrono::steady_clock::now();
  Model model = Load(options.model, n_ctx, options.mmap);
  const double load_s = Seconds(load_start);
  for (int32_t id : options.prompt_ids) {
    if (id < 0 || id >= model.hp.n_vocab) Die("prompt id " + std::to_string(id) + " is outside the vocabulary");
  }

  ggml_threadpool_params pool_params = ggml_threadpool_params_default(options.threads);
  Runner runner{model, std::vector<uint8_t>(size_t{2} << 30), ggml_threadpool_new(&pool_params), options.threads};
  std::memset(runner.scratch.data(), 0, runner.scratch.size());

  double best_prefill = 0.0, best_decode = 0.0;
  std::vector<Pick> picks;
  for (int rep = 0; rep < options.reps; ++rep) {
    std::vector<Pick> rep_picks;
    auto start = std::chrono::steady_clock::now();
    std::vector<float> logits;
    for (size_t at = 0; at < options.prompt_ids.size(); at += options.ubatch) {
      const size_t end = std::min(options.prompt_ids.size(), at + options.ubatch);
      logits = runner.Forward({options.prompt_ids.begin() + at, options.prompt_ids.begin() + end}, static_cast<int>(at));
    }
    rep_picks.push_back(Greedy(logits));
    const double prefill_s = Seconds(start);
    start = std::chrono::steady_clock::now();
    int n_past = static_cast<int>(options.prompt_ids.size());
    for (int i = 1; i < options.decode_tokens; ++i) {
      rep_picks.push_back(Greedy(runner.Forward({rep_picks.back().token}, n_past++)));
    }
    const double decode_s = Seconds(start);
    best_prefill = std::max(best_prefill, options.prompt_ids.size() / prefill_s);
    if (options.decode_tokens > 1) best_decode = std::max(best_decode, (options.decode_tokens - 1) / decode_s);
    if (rep == 0) picks = rep_picks;
  }
  ggml_threadpool_free(runner.pool);

  std::printf("{\"engine\": \"ggml\", \"model\": \"%s\", \"threads\": %d, \"prompt_tokens\": %zu, "
              "\"decode_tokens\": %d, \"reps\": %d, \"mmap\": %s, \"load_s\": %.2f, \"prefill_tokens_per_s\": %.2f, "
              "\"decode_tokens_per_s\": %.2f, \"tokens\": [",
              options.model.c_str(), options.threads, options.prompt_ids.size(), options.decode_tokens, options.reps,
              options.mmap ? "true" : "false", load_s, best_prefill, best_decode);
  for (size_t i = 0; i < picks.size(); ++i) std::printf("%s%d", i ? ", " : "", picks[i].token);
  std::printf("], \"logprobs\": [");
  for (size_t i = 0; i < picks.size(); ++i) std::printf("%s%.6f", i ? ", " : "", picks[i].logprob);
  std::printf("], \"system_info\": \"%s\"}\n", ggml_cpu_has_avx512_bf16() ? "avx512_bf16" : "no avx512_bf16");
  ggml_free(model.cache);
  ggml_free(model.weights);
  return 0;
}
