#include "coordinator/orchestration/planner/profile_io.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr char kHardwareFormat[] = "tandem-hardware-profile/1";
constexpr char kUsageFormat[] = "tandem-expert-usage/1";

// Reads typed fields of one JSON object, naming the full path on error.
class Reader {
 public:
  Reader(const std::string& file) : file_(file) {}

  absl::Status Error(const std::string& path, const std::string& what) const {
    if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(file_, ": ", what));
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", path, " ", what));
  }

  absl::StatusOr<const json*> Object(const json& parent, const std::string& key, const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return Error(path, "is missing");
    if (!it->is_object()) return Error(path, "must be an object");
    return &*it;
  }

  absl::StatusOr<double> Number(const json& parent, const std::string& key, const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return Error(path, "is missing");
    if (!it->is_number()) return Error(path, absl::StrCat("must be a number, got ", it->dump()));
    const double v = it->get<double>();
    if (!std::isfinite(v)) return Error(path, "must be finite");
    return v;
  }

  absl::StatusOr<int64_t> Int(const json& parent, const std::string& key, const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) return Error(path, "is missing");
    if (!it->is_number_integer()) return Error(path, absl::StrCat("must be an integer, got ", it->dump()));
    return it->get<int64_t>();
  }

  absl::StatusOr<std::string> String(const json& parent, const std::string& key, const std::string& path,
                                     bool required) const {
    auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) {
      if (required) return Error(path, "is missing");
      return std::string();
    }
    if (!it->is_string()) return Error(path, absl::StrCat("must be a string, got ", it->dump()));
    return it->get<std::string>();
  }

 private:
  std::string file_;
};

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& file) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(file, ": not valid JSON"));
  if (!root.is_object()) return absl::InvalidArgumentError(absl::StrCat(file, ": must hold a JSON object"));
  return root;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot create ", path));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

void CollectSource(const json& object, const std::string& path, HardwareProfile* profile) {
  auto it = object.find("source");
  if (it != object.end() && it->is_string()) profile->sources.emplace_back(path, it->get<std::string>());
}

// {"plateau_us", "base_us", "per_row_us"} or {"table": [[rows, us], ...]}.
absl::StatusOr<RooflineCurve> ReadCurve(const Reader& r, const json& object, const std::string& path) {
  auto table = object.find("table");
  const bool has_params = object.contains("plateau_us") || object.contains("base_us") || object.contains("per_row_us");
  if (!has_params && table != object.end() && !table->is_null()) {
    if (!table->is_array()) return r.Error(path + ".table", "must be a list of [rows, us] pairs");
    std::vector<TimingSample> samples;
    for (size_t i = 0; i < table->size(); ++i) {
      const json& pair = (*table)[i];
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_number()) {
        return r.Error(absl::StrCat(path, ".table[", i, "]"), absl::StrCat("must be [rows, us], got ", pair.dump()));
      }
      samples.push_back({pair[0].get<double>(), pair[1].get<double>()});
    }
    absl::StatusOr<RooflineCurve> fitted = FitRoofline(samples, path + ".table");
    if (!fitted.ok()) return r.Error("", std::string(fitted.status().message()));
    return *fitted;
  }
  RooflineCurve curve;
  auto missing = [&](const std::string& key) -> absl::Status {
    return r.Error(absl::StrCat(path, ".", key), "is missing (give plateau_us, base_us and per_row_us, or a table)");
  };
  for (const char* key : {"plateau_us", "base_us", "per_row_us"}) {
    if (!object.contains(key)) return missing(key);
  }
  TANDEM_ASSIGN_OR_RETURN(curve.plateau_us, r.Number(object, "plateau_us", path + ".plateau_us"));
  TANDEM_ASSIGN_OR_RETURN(curve.base_us, r.Number(object, "base_us", path + ".base_us"));
  TANDEM_ASSIGN_OR_RETURN(curve.per_row_us, r.Number(object, "per_row_us", path + ".per_row_us"));
  absl::Status valid = curve.Validate(path);
  if (!valid.ok()) return r.Error("", std::string(valid.message()));
  return curve;
}

// {"fixed_us", "gb_s"}; gb_s null = no per-byte cost.
absl::StatusOr<TransferCost> ReadTransfer(const Reader& r, const json& object, const std::string& path) {
  double fixed_us = 0;
  TANDEM_ASSIGN_OR_RETURN(fixed_us, r.Number(object, "fixed_us", path + ".fixed_us"));
  if (fixed_us < 0) return r.Error(path + ".fixed_us", "must be >= 0");
  auto gb = object.find("gb_s");
  if (gb == object.end()) return r.Error(path + ".gb_s", "is missing (a number > 0, or null for no per-byte cost)");
  if (gb->is_null()) return TransferCost{fixed_us, 0};
  if (!gb->is_number() || !(gb->get<double>() > 0) || !std::isfinite(gb->get<double>())) {
    return r.Error(path + ".gb_s", absl::StrCat("must be a number > 0 or null, got ", gb->dump()));
  }
  return TransferCost::FromBandwidth(fixed_us, gb->get<double>());
}

ordered_json CurveJson(const RooflineCurve& curve) {
  ordered_json out;
  out["plateau_us"] = curve.plateau_us;
  out["base_us"] = curve.base_us;
  out["per_row_us"] = curve.per_row_us;
  return out;
}

ordered_json TransferJson(const TransferCost& cost) {
  ordered_json out;
  out["fixed_us"] = cost.fixed_us;
  if (cost.us_per_byte > 0) {
    out["gb_s"] = cost.GbPerSecond();
  } else {
    out["gb_s"] = nullptr;
  }
  return out;
}

// "machine": the GPU, CPU and link the profile was measured on.
absl::Status ReadMachine(const Reader& r, const json& root, HardwareProfile* p) {
  TANDEM_ASSIGN_OR_RETURN(const json* machine, r.Object(root, "machine", "machine"));
  TANDEM_ASSIGN_OR_RETURN(p->gpu, r.String(*machine, "gpu", "machine.gpu", true));
  TANDEM_ASSIGN_OR_RETURN(p->cpu, r.String(*machine, "cpu", "machine.cpu", true));
  TANDEM_ASSIGN_OR_RETURN(p->pcie, r.String(*machine, "pcie", "machine.pcie", false));
  TANDEM_ASSIGN_OR_RETURN(p->kernel_plan, r.String(*machine, "kernel_plan", "machine.kernel_plan", false));
  TANDEM_ASSIGN_OR_RETURN(p->kernel_plan_source,
                          r.String(*machine, "kernel_plan_source", "machine.kernel_plan_source", false));
  CollectSource(*machine, "machine", p);
  return absl::OkStatus();
}

// "model": its shape, slots and the bytes an expert and a row move.
absl::Status ReadModel(const Reader& r, const json& root, HardwareProfile* p) {
  TANDEM_ASSIGN_OR_RETURN(const json* model, r.Object(root, "model", "model"));
  TANDEM_ASSIGN_OR_RETURN(p->model.name, r.String(*model, "name", "model.name", true));
  int64_t v = 0;
  TANDEM_ASSIGN_OR_RETURN(v, r.Int(*model, "num_layers", "model.num_layers"));
  if (v < 1) return r.Error("model.num_layers", "must be >= 1");
  p->model.num_layers = static_cast<int>(v);
  TANDEM_ASSIGN_OR_RETURN(v, r.Int(*model, "num_experts", "model.num_experts"));
  if (v < 1) return r.Error("model.num_experts", "must be >= 1");
  p->model.num_experts = static_cast<int>(v);
  TANDEM_ASSIGN_OR_RETURN(v, r.Int(*model, "num_experts_per_token", "model.num_experts_per_token"));
  if (v < 1 || v > p->model.num_experts) return r.Error("model.num_experts_per_token", "must be in [1, num_experts]");
  p->model.num_experts_per_token = static_cast<int>(v);
  TANDEM_ASSIGN_OR_RETURN(v, r.Int(*model, "gpu_expert_slots", "model.gpu_expert_slots"));
  if (v < 0) return r.Error("model.gpu_expert_slots", "must be >= 0");
  p->model.gpu_expert_slots = static_cast<int>(v);
  TANDEM_ASSIGN_OR_RETURN(p->cost.expert_bytes, r.Int(*model, "expert_bytes", "model.expert_bytes"));
  if (p->cost.expert_bytes < 1) return r.Error("model.expert_bytes", "must be >= 1");
  TANDEM_ASSIGN_OR_RETURN(p->cost.activation_row_bytes,
                          r.Int(*model, "activation_row_bytes", "model.activation_row_bytes"));
  if (p->cost.activation_row_bytes < 1) return r.Error("model.activation_row_bytes", "must be >= 1");
  CollectSource(*model, "model", p);
  return absl::OkStatus();
}

// "cost_model.transports": by name (the workers refer to them so).
absl::Status ReadTransports(const Reader& r, const json& cost, HardwareProfile* p) {
  TANDEM_ASSIGN_OR_RETURN(const json* transports, r.Object(cost, "transports", "cost_model.transports"));
  for (auto it = transports->begin(); it != transports->end(); ++it) {
    const std::string path = absl::StrCat("cost_model.transports.", it.key());
    if (!it->is_object()) return r.Error(path, "must be an object");
    NamedTransferCost t;
    t.name = it.key();
    TANDEM_ASSIGN_OR_RETURN(t.cost, ReadTransfer(r, *it, path));
    CollectSource(*it, path, p);
    p->cost.transports.push_back(t);
  }
  if (p->cost.transports.empty()) return r.Error("cost_model.transports", "must name at least one transport");
  return absl::OkStatus();
}

// "cost_model.cpu_workers": each one's transport (by name) and compute curve.
absl::Status ReadCpuWorkers(const Reader& r, const json& cost, HardwareProfile* p) {
  auto workers = cost.find("cpu_workers");
  if (workers == cost.end() || workers->is_null()) return r.Error("cost_model.cpu_workers", "is missing");
  if (!workers->is_array() || workers->empty()) return r.Error("cost_model.cpu_workers", "must be a non-empty list");
  for (size_t w = 0; w < workers->size(); ++w) {
    const std::string path = absl::StrCat("cost_model.cpu_workers[", w, "]");
    const json& worker = (*workers)[w];
    if (!worker.is_object()) return r.Error(path, "must be an object");
    CollectSource(worker, path, p);
    CpuWorkerCost c;
    TANDEM_ASSIGN_OR_RETURN(std::string transport, r.String(worker, "transport", path + ".transport", true));
    c.transport = -1;
    for (size_t t = 0; t < p->cost.transports.size(); ++t) {
      if (p->cost.transports[t].name == transport) c.transport = static_cast<int>(t);
    }
    if (c.transport < 0)
      return r.Error(path + ".transport",
                     absl::StrCat("names \"", transport, "\", which cost_model.transports does not list"));
    TANDEM_ASSIGN_OR_RETURN(const json* compute, r.Object(worker, "compute", path + ".compute"));
    TANDEM_ASSIGN_OR_RETURN(c.compute, ReadCurve(r, *compute, path + ".compute"));
    CollectSource(*compute, path + ".compute", p);
    p->cost.cpu_workers.push_back(c);
  }
  return absl::OkStatus();
}

// "cost_model": transports first, then the workers, the GPU, migration and DMA.
absl::Status ReadCostModel(const Reader& r, const json& root, HardwareProfile* p) {
  TANDEM_ASSIGN_OR_RETURN(const json* cost, r.Object(root, "cost_model", "cost_model"));
  CollectSource(*cost, "cost_model", p);
  TANDEM_RETURN_IF_ERROR(ReadTransports(r, *cost, p));
  TANDEM_RETURN_IF_ERROR(ReadCpuWorkers(r, *cost, p));
  TANDEM_ASSIGN_OR_RETURN(const json* gpu, r.Object(*cost, "gpu", "cost_model.gpu"));
  TANDEM_ASSIGN_OR_RETURN(p->cost.gpu, ReadCurve(r, *gpu, "cost_model.gpu"));
  CollectSource(*gpu, "cost_model.gpu", p);
  TANDEM_ASSIGN_OR_RETURN(const json* migrate, r.Object(*cost, "migrate", "cost_model.migrate"));
  TANDEM_ASSIGN_OR_RETURN(p->cost.migrate, ReadTransfer(r, *migrate, "cost_model.migrate"));
  CollectSource(*migrate, "cost_model.migrate", p);
  TANDEM_ASSIGN_OR_RETURN(const json* dma, r.Object(*cost, "dma", "cost_model.dma"));
  TANDEM_ASSIGN_OR_RETURN(p->cost.dma, ReadTransfer(r, *dma, "cost_model.dma"));
  CollectSource(*dma, "cost_model.dma", p);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HardwareProfile> ParseHardwareProfile(const std::string& json_text, const std::string& file_name) {
  TANDEM_ASSIGN_OR_RETURN(json root, ParseJson(json_text, file_name));
  const Reader r(file_name);
  HardwareProfile p;
  TANDEM_ASSIGN_OR_RETURN(std::string format, r.String(root, "format", "format", true));
  if (format != kHardwareFormat) {
    return r.Error("format", absl::StrCat("must be \"", kHardwareFormat, "\", got \"", format, "\""));
  }
  TANDEM_ASSIGN_OR_RETURN(p.name, r.String(root, "name", "name", true));
  TANDEM_ASSIGN_OR_RETURN(p.description, r.String(root, "description", "description", false));
  TANDEM_ASSIGN_OR_RETURN(p.source, r.String(root, "source", "source", false));
  TANDEM_ASSIGN_OR_RETURN(p.cache_key, r.String(root, "cache_key", "cache_key", false));
  TANDEM_RETURN_IF_ERROR(ReadMachine(r, root, &p));
  TANDEM_RETURN_IF_ERROR(ReadModel(r, root, &p));
  TANDEM_RETURN_IF_ERROR(ReadCostModel(r, root, &p));

  absl::Status valid = p.cost.Validate();
  if (!valid.ok()) return r.Error("", absl::StrCat("cost_model.", std::string(valid.message())));
  if (p.model.gpu_expert_slots > p.model.num_layers * p.model.num_experts) {
    return r.Error("model.gpu_expert_slots", "exceeds num_layers x num_experts");
  }
  return p;
}

absl::StatusOr<HardwareProfile> LoadHardwareProfile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseHardwareProfile(text, path);
}

std::string HardwareProfileToJson(const HardwareProfile& p) {
  auto source_of = [&](const std::string& path) -> std::string {
    for (const auto& [key, text] : p.sources) {
      if (key == path) return text;
    }
    return "";
  };
  auto with_source = [&](ordered_json object, const std::string& path) {
    const std::string source = source_of(path);
    if (!source.empty()) object["source"] = source;
    return object;
  };
  ordered_json root;
  root["format"] = kHardwareFormat;
  root["name"] = p.name;
  if (!p.description.empty()) root["description"] = p.description;
  if (!p.source.empty()) root["source"] = p.source;
  if (!p.cache_key.empty()) root["cache_key"] = p.cache_key;
  ordered_json machine;
  machine["gpu"] = p.gpu;
  machine["cpu"] = p.cpu;
  if (!p.pcie.empty()) machine["pcie"] = p.pcie;
  if (!p.kernel_plan.empty()) machine["kernel_plan"] = p.kernel_plan;
  if (!p.kernel_plan_source.empty()) machine["kernel_plan_source"] = p.kernel_plan_source;
  root["machine"] = with_source(machine, "machine");
  ordered_json model;
  model["name"] = p.model.name;
  model["num_layers"] = p.model.num_layers;
  model["num_experts"] = p.model.num_experts;
  model["num_experts_per_token"] = p.model.num_experts_per_token;
  model["gpu_expert_slots"] = p.model.gpu_expert_slots;
  model["expert_bytes"] = p.cost.expert_bytes;
  model["activation_row_bytes"] = p.cost.activation_row_bytes;
  root["model"] = with_source(model, "model");
  ordered_json cost;
  const std::string cost_source = source_of("cost_model");
  if (!cost_source.empty()) cost["source"] = cost_source;
  ordered_json workers = ordered_json::array();
  for (size_t w = 0; w < p.cost.cpu_workers.size(); ++w) {
    const std::string path = absl::StrCat("cost_model.cpu_workers[", w, "]");
    ordered_json worker;
    worker["transport"] = p.cost.transports[static_cast<size_t>(p.cost.cpu_workers[w].transport)].name;
    worker["compute"] = with_source(CurveJson(p.cost.cpu_workers[w].compute), path + ".compute");
    workers.push_back(with_source(worker, path));
  }
  cost["cpu_workers"] = workers;
  cost["gpu"] = with_source(CurveJson(p.cost.gpu), "cost_model.gpu");
  cost["migrate"] = with_source(TransferJson(p.cost.migrate), "cost_model.migrate");
  cost["dma"] = with_source(TransferJson(p.cost.dma), "cost_model.dma");
  ordered_json transports;
  for (const NamedTransferCost& t : p.cost.transports) {
    transports[t.name] = with_source(TransferJson(t.cost), "cost_model.transports." + t.name);
  }
  cost["transports"] = transports;
  root["cost_model"] = cost;
  return root.dump(2) + "\n";
}

absl::Status SaveHardwareProfile(const HardwareProfile& profile, const std::string& path) {
  return WriteFile(path, HardwareProfileToJson(profile));
}

absl::StatusOr<ExpertUsage> ParseExpertUsage(const std::string& json_text, const std::string& file_name) {
  TANDEM_ASSIGN_OR_RETURN(json root, ParseJson(json_text, file_name));
  const Reader r(file_name);
  TANDEM_ASSIGN_OR_RETURN(std::string format, r.String(root, "format", "format", true));
  if (format != kUsageFormat)
    return r.Error("format", absl::StrCat("must be \"", kUsageFormat, "\", got \"", format, "\""));
  ExpertUsage usage;
  int64_t v = 0;
  TANDEM_ASSIGN_OR_RETURN(v, r.Int(root, "num_layers", "num_layers"));
  if (v < 1) return r.Error("num_layers", "must be >= 1");
  usage.num_layers = static_cast<int>(v);
  TANDEM_ASSIGN_OR_RETURN(v, r.Int(root, "num_experts", "num_experts"));
  if (v < 1) return r.Error("num_experts", "must be >= 1");
  usage.num_experts = static_cast<int>(v);
  auto tokens = root.find("tokens");
  if (tokens == root.end() || tokens->is_null()) return r.Error("tokens", "is missing");
  if (!tokens->is_array() || tokens->size() != static_cast<size_t>(usage.num_layers)) {
    return r.Error("tokens", absl::StrCat("must be a list of num_layers = ", usage.num_layers, " lists"));
  }
  for (size_t l = 0; l < tokens->size(); ++l) {
    const json& layer = (*tokens)[l];
    if (!layer.is_array() || layer.size() != static_cast<size_t>(usage.num_experts)) {
      return r.Error(absl::StrCat("tokens[", l, "]"),
                     absl::StrCat("must list num_experts = ", usage.num_experts, " counts"));
    }
    for (size_t e = 0; e < layer.size(); ++e) {
      if (!layer[e].is_number() || !(layer[e].get<double>() >= 0)) {
        return r.Error(absl::StrCat("tokens[", l, "][", e, "]"),
                       absl::StrCat("must be a number >= 0, got ", layer[e].dump()));
      }
      usage.tokens.push_back(layer[e].get<double>());
    }
  }
  absl::Status valid = usage.Validate();
  if (!valid.ok()) return r.Error("tokens", std::string(valid.message()));
  return usage;
}

absl::StatusOr<ExpertUsage> LoadExpertUsage(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseExpertUsage(text, path);
}

std::string ExpertUsageToJson(const ExpertUsage& usage, const std::string& model_name) {
  ordered_json root;
  root["format"] = kUsageFormat;
  if (!model_name.empty()) root["model"] = model_name;
  root["num_layers"] = usage.num_layers;
  root["num_experts"] = usage.num_experts;
  ordered_json tokens = ordered_json::array();
  for (int l = 0; l < usage.num_layers; ++l) {
    ordered_json layer = ordered_json::array();
    for (int e = 0; e < usage.num_experts; ++e) layer.push_back(usage.At(l, e));
    tokens.push_back(layer);
  }
  root["tokens"] = tokens;
  return root.dump() + "\n";
}

absl::Status SaveExpertUsage(const ExpertUsage& usage, const std::string& model_name, const std::string& path) {
  return WriteFile(path, ExpertUsageToJson(usage, model_name));
}

}  // namespace tandem
