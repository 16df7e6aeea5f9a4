#include "coordinator/orchestration/planner/routing_trace_io.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

absl::Status LineError(const std::string& file, size_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", what));
}

// A non-negative integer field of `object`.
absl::StatusOr<int64_t> Count(const json& object, const char* key, const std::string& file, size_t line) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return LineError(file, line, absl::StrCat(key, " is missing"));
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return LineError(file, line, absl::StrCat(key, " must be an integer >= 0, got ", it->dump()));
  }
  return it->get<int64_t>();
}

// The header line: the format, then the trace's shape into `trace`.
absl::Status ReadTraceHeader(const json& object, const std::string& file_name, size_t line_no, RoutingTrace* trace) {
  auto format = object.find("format");
  if (format == object.end() || !format->is_string() || format->get<std::string>() != kRoutingTraceFormat) {
    return LineError(file_name, line_no, absl::StrCat("format must be \"", kRoutingTraceFormat, "\""));
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t layers, Count(object, "num_layers", file_name, line_no));
  TANDEM_ASSIGN_OR_RETURN(const int64_t experts, Count(object, "num_experts", file_name, line_no));
  TANDEM_ASSIGN_OR_RETURN(const int64_t k, Count(object, "num_experts_per_token", file_name, line_no));
  if (layers < 1 || experts < 1 || k < 1 || k > experts) {
    return LineError(file_name, line_no,
                     absl::StrCat("num_layers, num_experts, num_experts_per_token must be >= 1 and "
                                  "num_experts_per_token <= num_experts, got ",
                                  layers, ", ", experts, ", ", k));
  }
  trace->num_layers = static_cast<int>(layers);
  trace->num_experts = static_cast<int>(experts);
  trace->num_experts_per_token = static_cast<int>(k);
  auto dense = object.find("dense_layers");
  if (dense == object.end() || dense->is_null()) return absl::OkStatus();
  if (!dense->is_array() || dense->size() >= static_cast<size_t>(layers)) {
    return LineError(file_name, line_no, "dense_layers must be a list of fewer than num_layers layer indices");
  }
  for (const json& v : *dense) {
    const int64_t previous = trace->dense_layers.empty() ? -1 : trace->dense_layers.back();
    if (!v.is_number_integer() || v.get<int64_t>() <= previous || v.get<int64_t>() >= layers) {
      return LineError(file_name, line_no,
                       absl::StrCat("dense_layers must list increasing layers in [0, ", layers, "), got ", v.dump()));
    }
    trace->dense_layers.push_back(v.get<int64_t>());
  }
  return absl::OkStatus();
}

// A step line's [L][E] rows, added to `merged`'s.
absl::Status AddStepRows(const json& rows, const std::string& file_name, size_t line_no, int num_experts,
                         std::span<const int64_t> dense_layers, TraceStep* merged) {
  for (size_t l = 0; l < rows.size(); ++l) {
    const json& layer = rows[l];
    if (!layer.is_array() || layer.size() != static_cast<size_t>(num_experts)) {
      return LineError(file_name, line_no,
                       absl::StrCat("rows[", l, "] must hold num_experts (", num_experts, ") counts"));
    }
    const bool dense = std::binary_search(dense_layers.begin(), dense_layers.end(), static_cast<int64_t>(l));
    for (int e = 0; e < num_experts; ++e) {
      const json& v = layer[static_cast<size_t>(e)];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30)) {
        return LineError(file_name, line_no,
                         absl::StrCat("rows[", l, "][", e, "] must be a count >= 0, got ", v.dump()));
      }
      if (dense && v.get<int64_t>() != 0) {
        return LineError(file_name, line_no, absl::StrCat("rows[", l, "][", e, "] routes to a dense layer"));
      }
      merged->rows[l * static_cast<size_t>(num_experts) + static_cast<size_t>(e)] +=
          static_cast<int32_t>(v.get<int64_t>());
    }
  }
  return absl::OkStatus();
}

// What ParseRoutingTrace carries from line to line besides the trace.
struct TraceMerge {
  int64_t last_step = -1;
  std::vector<bool> opens;  // per merged step: a sequence starts in it
};

// A step line: merged into the trace's last step when it has the same step
// number (several sequences in one batch), else a new step.
absl::Status ReadTraceStep(const json& object, const std::string& file_name, size_t line_no, RoutingTrace* trace,
                           TraceMerge* merge) {
  TANDEM_ASSIGN_OR_RETURN(const int64_t step, Count(object, "step", file_name, line_no));
  TANDEM_ASSIGN_OR_RETURN(const int64_t start, Count(object, "start", file_name, line_no));
  TANDEM_ASSIGN_OR_RETURN(const int64_t tokens, Count(object, "tokens", file_name, line_no));
  auto phase = object.find("phase");
  if (phase == object.end() || !phase->is_string() ||
      (phase->get<std::string>() != "prefill" && phase->get<std::string>() != "decode")) {
    return LineError(file_name, line_no, "phase must be \"prefill\" or \"decode\"");
  }
  auto rows = object.find("rows");
  if (rows == object.end() || !rows->is_array() || rows->size() != static_cast<size_t>(trace->num_layers)) {
    return LineError(file_name, line_no,
                     absl::StrCat("rows must be an array of num_layers (", trace->num_layers, ") arrays"));
  }
  if (step < merge->last_step) {
    return LineError(file_name, line_no, absl::StrCat("step ", step, " comes after step ", merge->last_step));
  }
  if (step != merge->last_step) {
    trace->steps.push_back(TraceStep{});
    trace->steps.back().phase = Phase::kDecode;
    trace->steps.back().rows.assign(static_cast<size_t>(trace->num_layers) * static_cast<size_t>(trace->num_experts),
                                    0);
    merge->opens.push_back(false);
    merge->last_step = step;
  }
  TraceStep& merged = trace->steps.back();
  if (start == 0) merge->opens.back() = true;
  if (phase->get<std::string>() == "prefill") merged.phase = Phase::kPrefill;
  merged.tokens += static_cast<int>(tokens);
  return AddStepRows(*rows, file_name, line_no, trace->num_experts, trace->dense_layers, &merged);
}

}  // namespace

std::string RoutingTraceHeaderLine(const std::string& model, int num_layers, int num_experts, int num_experts_per_token,
                                   std::span<const int64_t> dense_layers) {
  ordered_json header;
  header["format"] = kRoutingTraceFormat;
  header["model"] = model;
  header["num_layers"] = num_layers;
  header["num_experts"] = num_experts;
  header["num_experts_per_token"] = num_experts_per_token;
  if (!dense_layers.empty()) header["dense_layers"] = std::vector<int64_t>(dense_layers.begin(), dense_layers.end());
  return header.dump();
}

std::string RoutingTraceStepLine(const RoutingTraceLine& line, int num_layers, int num_experts) {
  ordered_json out;
  out["step"] = line.step;
  out["sequence"] = line.sequence;
  out["phase"] = line.phase == Phase::kPrefill ? "prefill" : "decode";
  out["start"] = line.start_position;
  out["tokens"] = line.tokens;
  json rows = json::array();
  for (int l = 0; l < num_layers; ++l) {
    rows.push_back(std::vector<int32_t>(line.rows.begin() + static_cast<ptrdiff_t>(l) * num_experts,
                                        line.rows.begin() + static_cast<ptrdiff_t>(l + 1) * num_experts));
  }
  out["rows"] = std::move(rows);
  return out.dump();
}

absl::StatusOr<RoutingTrace> ParseRoutingTrace(const std::string& text, const std::string& file_name) {
  RoutingTrace trace;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  bool have_header = false;
  TraceMerge merge;
  for (size_t n = 0; n < lines.size(); ++n) {
    const size_t line_no = n + 1;
    if (lines[n].find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    json object = json::parse(lines[n].begin(), lines[n].end(), nullptr, /*allow_exceptions=*/false);
    if (object.is_discarded() || !object.is_object()) return LineError(file_name, line_no, "not a JSON object");
    if (!have_header) {
      TANDEM_RETURN_IF_ERROR(ReadTraceHeader(object, file_name, line_no, &trace));
      have_header = true;
      continue;
    }
    TANDEM_RETURN_IF_ERROR(ReadTraceStep(object, file_name, line_no, &trace, &merge));
  }
  if (!have_header)
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": empty routing trace (no header line)"));
  int sequence = -1;
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (merge.opens[i] || sequence < 0) ++sequence;
    trace.steps[i].sequence = sequence;
  }
  return trace;
}

absl::StatusOr<RoutingTrace> LoadRoutingTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open routing trace ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseRoutingTrace(text.str(), path);
}

absl::Status SaveRoutingTrace(const RoutingTrace& trace, const std::string& model, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write routing trace ", path));
  out << RoutingTraceHeaderLine(model, trace.num_layers, trace.num_experts, trace.num_experts_per_token,
                                trace.dense_layers)
      << "\n";
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const TraceStep& step = trace.steps[i];
    const bool first = i == 0 || trace.steps[i - 1].sequence != step.sequence;
    RoutingTraceLine line{static_cast<int64_t>(i), step.sequence, step.phase, first ? 0 : 1, step.tokens, step.rows};
    out << RoutingTraceStepLine(line, trace.num_layers, trace.num_experts) << "\n";
  }
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("writing routing trace ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace tandem
