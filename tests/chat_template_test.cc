// tandem's chat-template engine against python3-jinja2 as the oracle: every
// template of tests/data/chat_templates (model-style ones against every
// conversation, feature ones against features/context.json) is rendered by
// both, in transformers' environment (tests/chat_template_oracle.py), and
// must give the same bytes, or both fail (with the same message when the
// template itself raised). Skipped, saying why, when python3 or jinja2 is
// missing (Debian: python3-jinja2).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kCorpus = fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "chat_templates";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<fs::path> Files(const fs::path& dir, const std::string& extension) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == extension) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// One render: a template and apply_chat_template's arguments.
struct Job {
  std::string id;
  std::string source;
  ChatTemplateInputs inputs;
};

Job MakeJob(const std::string& id, const std::string& source, const ordered_json& spec,
            const ordered_json& default_context) {
  Job job{.id = id, .source = source};
  job.inputs.messages = spec.at("messages");
  job.inputs.tools = spec.value("tools", ordered_json());
  job.inputs.add_generation_prompt = spec.value("add_generation_prompt", false);
  job.inputs.continue_final_message = spec.value("continue_final_message", false);
  job.inputs.extra_context = default_context;
  const ordered_json extra = spec.value("extra_context", ordered_json::object());
  for (const auto& [key, value] : extra.items()) job.inputs.extra_context[key] = value;
  return job;
}

std::vector<Job> CorpusJobs() {
  std::vector<Job> jobs;
  // The special tokens a Llama/Mistral tokenizer config gives every template.
  const ordered_json special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
  const std::vector<fs::path> conversations = Files(kCorpus / "conversations", ".json");
  for (const fs::path& model : Files(kCorpus / "models", ".jinja")) {
    const std::string source = ReadFile(model);
    for (const fs::path& conversation : conversations) {
      jobs.push_back(MakeJob(model.stem().string() + " x " + conversation.stem().string(), source,
                             ordered_json::parse(ReadFile(conversation)), special_tokens));
    }
  }
  const ordered_json context = ordered_json::parse(ReadFile(kCorpus / "features" / "context.json"));
  for (const fs::path& feature : Files(kCorpus / "features", ".jinja")) {
    jobs.push_back(MakeJob(feature.stem().string(), ReadFile(feature), context, ordered_json::object()));
  }
  // snippets.txt: one template per line, "⏎" standing for a newline.
  std::istringstream snippets(ReadFile(kCorpus / "snippets.txt"));
  std::string line;
  for (int line_number = 1; std::getline(snippets, line); ++line_number) {
    if (line.empty() || line.rfind("##", 0) == 0) continue;
    const std::string newline_mark = "⏎";
    std::string source;
    for (size_t i = 0; i < line.size();) {
      if (line.compare(i, newline_mark.size(), newline_mark) == 0) {
        source.push_back('\n');
        i += newline_mark.size();
      } else {
        source.push_back(line[i++]);
      }
    }
    jobs.push_back(MakeJob("snippets.txt:" + std::to_string(line_number), source, context, ordered_json::object()));
  }
  return jobs;
}

ordered_json JobJson(const Job& job) {
  return {{"id", job.id},
          {"template", job.source},
          {"messages", job.inputs.messages},
          {"tools", job.inputs.tools},
          {"documents", job.inputs.documents},
          {"add_generation_prompt", job.inputs.add_generation_prompt},
          {"continue_final_message", job.inputs.continue_final_message},
          {"extra_context", job.inputs.extra_context}};
}

std::string Python() {
  const std::string configured = TANDEM_PYTHON3;
  if (!configured.empty()) return configured;
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "";
}

// Runs `command` with /bin/sh; its exit code and output.
int RunShell(const std::string& command, std::string* output) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ScopedDir {
 public:
  ScopedDir() {
    std::string pattern = (fs::temp_directory_path() / "chat_template_test.XXXXXX").string();
    path_ = mkdtemp(pattern.data()) != nullptr ? fs::path(pattern) : fs::path();
  }
  ~ScopedDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(ChatTemplateOracleTest, CorpusRendersLikeJinja2) {
  const std::string python = Python();
  if (python.empty()) GTEST_SKIP() << "no python3 found (TANDEM_PYTHON3 empty, no /usr/bin/python3)";
  std::string probe;
  if (RunShell("'" + python + "' -c 'import jinja2' 2>&1", &probe) != 0) {
    GTEST_SKIP() << python << " cannot import jinja2 (Debian: apt-get install python3-jinja2): " << probe;
  }

  const std::vector<Job> jobs = CorpusJobs();
  ASSERT_GE(jobs.size(), 100u) << "corpus under " << kCorpus << " looks incomplete";
  ScopedDir dir;
  ASSERT_FALSE(dir.path().empty());
  ordered_json jobs_json = ordered_json::array();
  for (const Job& job : jobs) jobs_json.push_back(JobJson(job));
  std::ofstream(dir.path() / "jobs.json", std::ios::binary) << jobs_json.dump();

  std::string log;
  const int rc =
      RunShell("'" + python + "' '" TANDEM_SOURCE_DIR "/tests/chat_template_oracle.py' '" +
                   (dir.path() / "jobs.json").string() + "' '" + (dir.path() / "results.json").string() + "' 2>&1",
               &log);
  if (rc == 3) GTEST_SKIP() << "the oracle cannot import jinja2: " << log;
  ASSERT_EQ(rc, 0) << "oracle failed:\n" << log;
  const ordered_json oracle = ordered_json::parse(ReadFile(dir.path() / "results.json"));
  std::map<std::string, ordered_json> expected;
  for (const ordered_json& result : oracle.at("results")) expected[result.at("id")] = result;

  int equal_outputs = 0, equal_raises = 0, both_failed = 0;
  for (const Job& job : jobs) {
    SCOPED_TRACE(job.id);
    const ordered_json& want = expected.at(job.id);
    absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl = ChatTemplate::Create(job.source, {.name = job.id});
    const absl::StatusOr<std::string> got = tmpl.ok() ? (*tmpl)->Render(job.inputs) : tmpl.status();
    if (want.at("ok")) {
      if (!got.ok()) {
        ADD_FAILURE() << "jinja2 rendered it, tandem failed: " << got.status();
      } else if (*got != want.at("output").get<std::string>()) {
        EXPECT_EQ(*got, want.at("output").get<std::string>());
      } else {
        ++equal_outputs;
      }
    } else if (got.ok()) {
      ADD_FAILURE() << "jinja2 failed (" << want.at("error_type") << ": " << want.at("error") << "), tandem rendered:\n"
                    << *got;
    } else if (want.at("error_type") == "TemplateError") {
      EXPECT_TRUE(IsRaisedByTemplate(got.status())) << got.status();
      EXPECT_EQ(got.status().message(), want.at("error").get<std::string>());
      ++equal_raises;
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
      ++both_failed;
    }
  }
  std::printf("chat templates vs jinja2 %s: %zu renders: %d byte-equal, %d same raise_exception, %d both type errors\n",
              oracle.at("jinja2_version").get<std::string>().c_str(), jobs.size(), equal_outputs, equal_raises,
              both_failed);
  EXPECT_GE(equal_outputs, 90);
}

}  // namespace
}  // namespace tandem
