// Sizes and flags beyond what tandem can hold (issue 15, item 11) fail at
// start-up with a message naming the field or flag, before anything is
// allocated from them: never std::bad_alloc, an uncaught std::system_error,
// or an abort on the first request. Each case runs the real program and
// requires a clean exit code (a signal would mean a crash).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model/synthetic_model.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const std::string kBin = TANDEM_BINARY_DIR "/bin/";

class BadFlagsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    *written_ = WriteSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 3}, dir_->path() / "model",
                                    {.with_tokenizer = false});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_OK(*written_); }

  // A copy of the model whose config.json has `field` = `value`.
  static fs::path WithConfig(const std::string& field, const nlohmann::json& value) {
    const fs::path dir = dir_->path() / absl::StrCat("bad-", field);
    fs::create_directories(dir);
    for (const auto& entry : fs::directory_iterator(dir_->path() / "model")) {
      fs::copy(entry.path(), dir / entry.path().filename(), fs::copy_options::overwrite_existing);
    }
    nlohmann::json config;
    std::ifstream(dir / "config.json") >> config;
    config[field] = value;
    std::ofstream(dir / "config.json", std::ios::trunc) << config.dump(2);
    return dir;
  }

  // Runs `argv` to its end; it must exit (not die by a signal) with a
  // non-zero code and say `expect` on stderr.
  static void ExpectRefused(const std::vector<std::string>& argv, const std::string& expect) {
    auto run = RunProcess(argv, {}, dir_->path(), absl::Seconds(60));
    ASSERT_OK(run);
    const std::string what = absl::StrCat(argv[0], " ", argv.size() > 1 ? argv[1] : "", "...");
    EXPECT_GT(run->exit_code, 0) << what << " died by a signal or succeeded: " << run->err;
    EXPECT_NE(run->err.find(expect), std::string::npos) << what << ": " << run->err;
  }

  static ScopedTempDir* dir_;
  static absl::Status* written_;
};

ScopedTempDir* BadFlagsTest::dir_ = nullptr;
absl::Status* BadFlagsTest::written_ = new absl::Status();

TEST_F(BadFlagsTest, HugeConfigSizesAreRefusedByEveryProgram) {
  // The case: 2^31 - 1 layers aborted server and worker with std::bad_alloc.
  const fs::path layers = WithConfig("num_hidden_layers", 2147483647);
  const std::string socket = (dir_->path() / "w.sock").string();
  ExpectRefused({kBin + "tandem-server", "--model", layers.string(), "--threads", "1", "--listen",
                 "unix:" + (dir_->path() / "s.sock").string()},
                "\"num_hidden_layers\" is 2147483647, more than tandem accepts");
  ExpectRefused({kBin + "tandem-generate", "--model", layers.string(), "--prompt_ids", "1", "-n", "1"},
                "\"num_hidden_layers\" is 2147483647");
  ExpectRefused({kBin + "tandem-cpu-worker", "--model", layers.string(), "--socket", socket, "--threads", "1"},
                "\"num_hidden_layers\" is 2147483647");

  struct Case {
    std::string field;
    nlohmann::json value;
  };
  for (const Case& c : std::vector<Case>{{"hidden_size", int64_t{1} << 40},
                                         {"intermediate_size", int64_t{1} << 40},
                                         {"vocab_size", int64_t{1} << 40},
                                         {"num_local_experts", 1000000},
                                         {"num_attention_heads", 1 << 20},
                                         {"max_position_embeddings", int64_t{1} << 40},
                                         {"eos_token_id", int64_t{1} << 33},
                                         {"bos_token_id", int64_t{1} << 33}}) {
    const fs::path dir = WithConfig(c.field, c.value);
    ExpectRefused({kBin + "tandem-generate", "--model", dir.string(), "--prompt_ids", "1", "-n", "1"},
                  absl::StrCat("\"", c.field, "\""));
  }
}

TEST_F(BadFlagsTest, FlagsBeyondWhatTheMachineCanHoldAreRefusedNamingTheFlag) {
  const std::string model = (dir_->path() / "model").string();
  const std::string listen = "unix:" + (dir_->path() / "s.sock").string();
  // Accepted, then aborted on the first request, before.
  ExpectRefused({kBin + "tandem-server", "--model", model, "--listen", listen, "--kv_block_size", "1000000000"},
                "--kv_block_size 1000000000");
  ExpectRefused({kBin + "tandem-server", "--model", model, "--listen", listen, "--kv_cache_tokens", "1000000000000000"},
                "--kv_cache_tokens 1000000000000000");
  ExpectRefused({kBin + "tandem-server", "--model", model, "--listen", listen, "--max_sequences", "100000000"},
                "max_sequences must be <=");
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--execution_policy",
                 "makespan", "--gpu_memory_mb", "9223372036854775807"},
                "--gpu_memory_mb 9223372036854775807");
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--execution_policy",
                 "makespan", "--gpu_slots", "100000"},
                "--gpu_slots 100000");
  // An uncaught std::system_error, before.
  ExpectRefused({kBin + "tandem-server", "--model", model, "--listen", listen, "--threads", "100000"},
                "--threads 100000");
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--threads", "100000"},
                "--threads 100000");
  ExpectRefused({kBin + "tandem-cpu-worker", "--model", model, "--socket", (dir_->path() / "w.sock").string(),
                 "--threads", "100000"},
                "--threads 100000");
}

TEST_F(BadFlagsTest, GgufWeightModesAreCheckedNamingTheFlag) {
  const std::string model = (dir_->path() / "model").string();
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--gguf_dense", "int4"},
                "--gguf_dense \"int4\": expected auto, quantized or bf16");
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--gguf_experts", "q4"},
                "--gguf_experts \"q4\": expected auto, quantized or bf16");
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--load_weights", "mmap"},
                "--load_weights \"mmap\": expected copy or map");
  // The CUDA backend's dense code computes float weights only.
  ExpectRefused({kBin + "tandem-generate", "--model", model, "--prompt_ids", "1", "-n", "1", "--backend", "cuda",
                 "--gguf_dense", "quantized"},
                "--backend cuda computes only float dense weights");
}

}  // namespace
}  // namespace tandem
