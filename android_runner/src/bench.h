// bench mode: load an artifact, time it, and describe the run as one JSON object.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "model.h"
#include "options.h"
#include "peak.h"
#include "sysinfo.h"
#include "tensor_io.h"

namespace agoc {

struct SampleStats {
  double mean_ms = 0, median_ms = 0, min_ms = 0, max_ms = 0, std_ms = 0;  // std: sample (n-1)
};

struct OutputRecord {
  TensorSpec spec;
  Checksum checksum;
  std::string file;  // empty unless --outputs-dir
};

struct BenchResult {
  BenchOptions options;
  std::string library_kind;
  double load_ms = 0;
  std::vector<double> samples_ms;
  SampleStats stats;
  int threads = 0;
  std::vector<int> cores;
  std::vector<CpuFreq> cpu_freqs;
  std::vector<ThermalZone> thermal;
  std::vector<OutputRecord> outputs;
  std::vector<KernelTimer::Summary> kernels;
  Peak peak;  // with --per-kernel
};

// Throws RunnerError with the exit code of whatever went wrong.
BenchResult RunBench(const BenchOptions& options);

void WriteBenchJson(const BenchResult& result, std::ostream& os);

SampleStats Summarize(const std::vector<double>& samples_ms);

}  // namespace agoc
