// The planner's cost model (ARCHITECTURE.md "Cost model"): how long one
// expert takes on each CPU worker and on the GPU, what a migration (one
// expert's weights host→GPU) costs, and the fixed + per-byte cost of moving
// activations (dma, GPU↔host) and of a dispatch round trip per transport
// (ipc). Fitted at start-up from measured tables, refined online from the
// timings of every RunExperts and migration (EWMA), and scored: every
// Observe* call first records how far the model's prediction was from the
// measurement (mean absolute % error over the last N observations).
//
// Pure: no I/O (hardware-profile files live in profile_io.h), no threads.
// Not thread-safe; the coordinator owns one and feeds it from its engine
// thread. Units: µs for time, bytes for sizes, rows = tokens routed to one
// expert in one layer (s in the papers).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/expert_division.h"

namespace tandem {

// One expert's latency against its rows, roofline-shaped:
//   us(s) = max(plateau_us, base_us + per_row_us * s)   for s > 0, 0 for s = 0.
// Flat while the expert is memory-bound (its weights are streamed once
// whatever s is), then linear once compute dominates. Fiddler models the CPU
// as purely linear (plateau 0, base 0) and the GPU as constant (per_row 0):
// both are special cases. Non-decreasing in s when per_row_us >= 0, which
// Validate() demands and the makespan planner's proof relies on.
struct RooflineCurve {
  double plateau_us = 0;
  double base_us = 0;
  double per_row_us = 0;

  double Us(double rows) const;
  // Rows where the linear part overtakes the plateau (0 when there is no
  // plateau, +inf when the curve is flat).
  double BreakpointRows() const;
  absl::Status Validate(const std::string& field) const;
};

// One measured point of a latency table.
struct TimingSample {
  double rows = 0;
  double us = 0;
};

// Fits a RooflineCurve to a measured table (any order; repeated rows are
// fine). Minimises the squared *relative* error, since tables span orders of
// magnitude (13 ms at 1 row, 1.3 s at 512): every split of the sorted samples
// into a plateau prefix and a linear suffix is tried, the plateau fitted to
// the prefix and a weighted least-squares line to the suffix, and the split
// with the least error of the resulting max() curve wins. The slope is
// clamped to >= 0 so the curve stays non-decreasing. InvalidArgument naming
// `field` when there are fewer than 2 samples or a sample has rows <= 0 or
// us <= 0.
absl::StatusOr<RooflineCurve> FitRoofline(std::span<const TimingSample> samples, const std::string& field = "table");

// fixed_us + bytes * us_per_byte. us_per_byte = 0 means "no per-byte cost"
// (e.g. no GPU↔host hop at all on the no-GPU pool).
struct TransferCost {
  double fixed_us = 0;
  double us_per_byte = 0;

  static TransferCost FromBandwidth(double fixed_us, double gb_s);  // gb_s > 0; 1 GB/s = 1e3 bytes/µs
  double Us(double bytes) const { return bytes <= 0 ? 0 : fixed_us + bytes * us_per_byte; }
  double GbPerSecond() const { return us_per_byte > 0 ? 1e-3 / us_per_byte : 0; }  // 0 = unbounded
  absl::Status Validate(const std::string& field) const;
};

struct CpuWorkerCost {
  // One WHOLE expert computed by this worker alone, against rows. Under
  // split the worker computes 1/num_workers of every expert's intermediate
  // dimension, which scales both the memory-bound and the compute-bound part
  // by that share, so its time is share * compute.Us(s).
  RooflineCurve compute;
  // Index into CostModelParams::transports: how the coordinator reaches it.
  int transport = 0;
};

struct NamedTransferCost {
  std::string name;  // "shm", "shm-grpc", "inline" (coordinator/remote_expert_executor.h), "local"
  TransferCost cost;
};

// Everything that defines the model; what a hardware profile stores.
struct CostModelParams {
  // One expert's weights as the pool stores them (quantized blocks when the
  // experts are kept quantized; the mean over layers when the layers' types
  // differ), what a migration copies.
  int64_t expert_bytes = 0;
  int64_t activation_row_bytes = 0;  // one row of expert input (= of output): D * sizeof(f32)
  std::vector<CpuWorkerCost> cpu_workers;
  RooflineCurve gpu;     // one resident expert on the GPU
  TransferCost migrate;  // host→GPU weight copy, applied to expert_bytes
  TransferCost dma;      // activations GPU↔host, per direction
  std::vector<NamedTransferCost> transports;

  // InvalidArgument naming the first bad field.
  absl::Status Validate() const;
};

// A model whose one CPU worker is the whole CPU (what the papers measured),
// divided into `num_workers` equal workers (one per NUMA node): each has
// 1/num_workers of the cores and of the memory bandwidth, so alone it takes
// num_workers times as long for a whole expert, and under split (each
// computing 1/num_workers of every expert) the workers together match the
// whole CPU. Every worker keeps the one worker's transport.
// InvalidArgument unless params has exactly one worker and num_workers >= 1.
absl::StatusOr<CostModelParams> DivideCpuIntoWorkers(const CostModelParams& params, int num_workers);

// The cost model for `num_workers` CPU workers from a profile's parameters:
// a whole-CPU (one-worker) profile is divided with DivideCpuIntoWorkers, one
// that lists exactly num_workers workers is used as it is (num_workers <= 1:
// as it is). InvalidArgument when the counts disagree; Create's errors.
absl::StatusOr<class CostModel> CostModelForWorkers(const CostModelParams& params, int num_workers);

struct CostModelOptions {
  double ewma_alpha = 0.1;  // weight of a new observation in the online refinement
  int error_window = 64;    // observations the mean absolute % error covers
  absl::Status Validate() const;
};

// How well one term predicted its last `error_window` observations.
struct TermAccuracy {
  int64_t observations = 0;  // since creation
  int window = 0;            // observations in the window (<= error_window)
  double mape_percent = 0;   // mean |predicted - measured| / measured * 100 over the window
};

struct CostModelStats {
  TermAccuracy cpu;  // all workers together
  TermAccuracy gpu;
  TermAccuracy migrate;
  TermAccuracy dma;
  TermAccuracy ipc;
  TermAccuracy makespan;  // whole-layer plans (ObserveMakespan)
};

class CostModel {
 public:
  static absl::StatusOr<CostModel> Create(CostModelParams params, CostModelOptions options = {});

  const CostModelParams& params() const { return params_; }
  int num_cpu_workers() const { return static_cast<int>(params_.cpu_workers.size()); }

  // cpu_w(s): one whole expert with `rows` rows on worker w (see CpuWorkerCost).
  double CpuUs(int worker, double rows) const {
    return params_.cpu_workers[static_cast<size_t>(worker)].compute.Us(rows);
  }
  // gpu(s): one resident expert on the GPU.
  double GpuUs(double rows) const { return params_.gpu.Us(rows); }
  // migrate: one expert host→GPU.
  double MigrateUs() const { return params_.migrate.Us(static_cast<double>(params_.expert_bytes)); }
  // dma(bytes): activations between GPU and host, one direction.
  double DmaUs(double bytes) const { return params_.dma.Us(bytes); }
  // ipc_t(bytes): one dispatch round trip to worker w over its transport.
  double IpcUs(int worker, double bytes) const;
  // ipc_t(bytes) by transport name; InvalidArgument for an unknown one.
  absl::StatusOr<double> TransportUs(const std::string& transport, double bytes) const;

  // The latency of one expert alone on the CPU side, Fiddler's cpu_lat(s):
  // split runs its slices on every worker in parallel (max_w share * cpu_w),
  // shard runs it whole on `owner`. Compute only, as Fiddler's model.
  double CpuExpertUs(double rows, ExpertDivision division, int owner) const;

  // Online refinement. Each call first scores the current prediction against
  // `measured_us` (TermAccuracy), then moves the model toward it by
  // ewma_alpha. Observations that cannot be scored (measured <= 0, nothing
  // predicted) are ignored. `rows` lists the rows of every expert the one
  // measured call computed (a RunExperts batch); `share` is the fraction of
  // each expert the worker computed (1 / num_workers under split, 1 under
  // shard), since the curves are for whole experts.
  void ObserveCpu(int worker, std::span<const int32_t> rows, double measured_us, double share = 1.0);
  void ObserveGpu(std::span<const int32_t> rows, double measured_us);
  // One expert's copy of `bytes` (0: expert_bytes); a layer whose experts
  // are larger or smaller than expert_bytes (quantized layers of mixed
  // types) refines the rate, not the size.
  void ObserveMigration(double measured_us, double bytes = 0);
  void ObserveDma(double bytes, double measured_us);
  void ObserveIpc(int worker, double bytes, double measured_us);
  // Scores a whole plan (predicted makespan vs the layer's measured time);
  // changes no parameter.
  void ObserveMakespan(double predicted_us, double measured_us);

  CostModelStats Stats() const;

 private:
  // Fixed-size ring of absolute percentage errors.
  class ErrorWindow {
   public:
    explicit ErrorWindow(int capacity = 1) : errors_(static_cast<size_t>(capacity), 0.0) {}
    void Add(double predicted, double measured);
    TermAccuracy Accuracy() const;

   private:
    std::vector<double> errors_;
    int64_t count_ = 0;
  };

  CostModel(CostModelParams params, CostModelOptions options);
  void RefineCurve(RooflineCurve& curve, std::span<const int32_t> rows, double measured_us);
  void RefineTransfer(TransferCost& cost, double bytes, double measured_us);

  CostModelParams params_;
  CostModelOptions options_;
  ErrorWindow cpu_error_, gpu_error_, migrate_error_, dma_error_, ipc_error_, makespan_error_;
};

}  // namespace tandem
