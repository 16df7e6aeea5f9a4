#include "bench/json_lines.h"

#include <cstdio>
#include <fstream>
#include <mutex>

#include "common/base/cpu_features.h"

namespace tandem {
namespace {

std::mutex& StampMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}

nlohmann::json& Extra() {
  static nlohmann::json* extra = new nlohmann::json(nlohmann::json::object());
  return *extra;
}

// The 1-minute load average: other work on a shared machine shows up here
// before it shows up as noise in the figures.
double LoadAverage1m() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

}  // namespace

nlohmann::json BenchStamp() {
  const CpuFeatures& cpu = HostCpu();
  nlohmann::json stamp = {{"cpu", cpu.Description()},
                          {"cpu_flags", cpu.Flags()},
                          {"isa", ActiveIsaDescription()},
                          {"load_1m", LoadAverage1m()}};
  std::lock_guard<std::mutex> lock(StampMutex());
  for (auto it = Extra().begin(); it != Extra().end(); ++it) stamp[it.key()] = it.value();
  return stamp;
}

void SetBenchStamp(const std::string& key, nlohmann::json value) {
  std::lock_guard<std::mutex> lock(StampMutex());
  Extra()[key] = std::move(value);
}

void EmitJsonLine(nlohmann::json line) {
  const nlohmann::json stamp = BenchStamp();
  for (auto it = stamp.begin(); it != stamp.end(); ++it)
    if (!line.contains(it.key())) line[it.key()] = it.value();
  std::fputs((line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace tandem
