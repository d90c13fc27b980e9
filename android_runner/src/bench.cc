#include "bench.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>

#include "errors.h"
#include "json.h"

// Under valgrind's callgrind (`--collect-atstart=no`), costs are collected only around the timed
// runs (the phone-cache proxy, host/proxy.py). Outside valgrind these client requests are a few
// instructions that do nothing; without the header (an NDK build) they are compiled out.
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define AGOC_HAVE_CALLGRIND 1
#endif
#endif

namespace agoc {
namespace ffi = tvm::ffi;

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void Log(const std::string& message) { std::cerr << "agoc-runner: " << message << std::endl; }

// Inputs from the artifact's files, or seeded random data (one seed stream per input).
std::vector<HostTensor> LoadInputs(const BenchOptions& options, const IoSpec& io) {
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < io.inputs.size(); ++i) {
    inputs.push_back(options.random_inputs ? RandomTensor(io.inputs[i], options.seed + 0x1000 * i)
                                           : ReadTensorFile(options.artifact_dir, io.inputs[i]));
  }
  return inputs;
}

void PrepareOutputsDir(const std::string& dir) {
  if (dir.empty() || DirExists(dir)) return;
  if (mkdir(dir.c_str(), 0755) != 0 && !DirExists(dir)) {
    throw RunnerError(kExitMissingFile, "cannot create --outputs-dir " + dir + " (does its parent exist?)");
  }
}

// Must run before the runtime starts its thread pool (the pool reads TVM_NUM_THREADS once).
void SetThreadEnvironment(const BenchOptions& options) {
  const int threads = options.threads ? options.threads : static_cast<int>(options.cores.size());
  if (threads > 0) setenv("TVM_NUM_THREADS", std::to_string(threads).c_str(), 1);
  if (!options.cores.empty()) PinToCores(options.cores);
}

// Tells the runtime's pool what to use. With --cores: those cpus, one worker per core when the
// counts match (kSpecifyOneCorePerThread), else all workers sharing them (kSpecifyThreadShareAllCore).
// With only --threads: K workers on the fastest cores (kBig; by default TVM would use at most the
// number of cores that share the top frequency, e.g. 4 of 8 on a big.LITTLE phone).
void ConfigureThreadPool(const BenchOptions& options) {
  if (options.cores.empty() && options.threads == 0) return;
  auto config = ffi::Function::GetGlobal("runtime.config_threadpool");
  if (!config) {
    Log("warning: runtime.config_threadpool is not available; using the runtime's default pool");
    return;
  }
  constexpr int kBig = 1, kOneCorePerThread = -2, kShareAllCores = -3;
  if (options.cores.empty()) {
    (*config)(kBig, options.threads);
    return;
  }
  const int threads = options.threads ? options.threads : static_cast<int>(options.cores.size());
  const int mode = threads == static_cast<int>(options.cores.size()) ? kOneCorePerThread : kShareAllCores;
  ffi::Array<ffi::String> cpus;
  for (int core : options.cores) cpus.push_back(ffi::String(std::to_string(core)));
  (*config)(mode, threads, cpus);
}

int RuntimeThreads(const BenchOptions& options) {
  if (auto num_threads = ffi::Function::GetGlobal("runtime.NumThreads")) return (*num_threads)().cast<int>();
  return options.threads;
}

// The entry function once. The VM checks each argument against the function's signature and
// names the parameter in its error ("ErrorContext(fn=main, loc=param[0], ...)"): that is an
// input that does not fit the model (kExitMismatch); any other error is a run failure (kExitRun).
std::vector<ffi::Tensor> RunOnce(Model* model, const std::vector<ffi::Tensor>& inputs,
                                 const std::vector<ffi::Tensor>& destinations, const char* phase, int index) {
  try {
    return model->Run(inputs, destinations);
  } catch (const ffi::Error& error) {
    const std::string what = error.kind() + ": " + error.message();
    if (what.find("loc=param[") != std::string::npos) {
      throw RunnerError(kExitMismatch, "the inputs do not fit the model (is io.txt from this artifact?): " + what);
    }
    throw RunnerError(kExitRun, std::string(phase) + " run " + std::to_string(index) + " failed: " + what);
  }
}

std::vector<OutputRecord> RecordOutputs(const std::vector<ffi::Tensor>& outputs, const IoSpec& io,
                                        const std::string& outputs_dir) {
  if (outputs.size() != io.outputs.size()) {
    throw RunnerError(kExitMismatch, "the model returned " + std::to_string(outputs.size()) +
                                         " outputs, io.txt lists " + std::to_string(io.outputs.size()));
  }
  std::vector<OutputRecord> records;
  for (size_t i = 0; i < outputs.size(); ++i) {
    HostTensor host = ToHostTensor(outputs[i], io.outputs[i]);
    OutputRecord record{io.outputs[i], ComputeChecksum(host), ""};
    if (!outputs_dir.empty()) {
      record.file = JoinPath(outputs_dir, "output_" + std::to_string(i) + ".bin");
      WriteTensorFile(record.file, host);
    }
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace

SampleStats Summarize(const std::vector<double>& samples) {
  SampleStats s;
  if (samples.empty()) return s;
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.min_ms = sorted.front();
  s.max_ms = sorted.back();
  s.median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  s.mean_ms = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  double squares = 0;
  for (double x : sorted) squares += (x - s.mean_ms) * (x - s.mean_ms);
  s.std_ms = n > 1 ? std::sqrt(squares / (n - 1)) : 0.0;
  return s;
}

namespace {

IoSpec OpenArtifact(const BenchOptions& options, std::string* library_path) {
  *library_path = JoinPath(options.artifact_dir, "model.so");
  if (!DirExists(options.artifact_dir)) {
    throw RunnerError(kExitMissingFile, "no artifact directory at " + options.artifact_dir);
  }
  if (!FileExists(*library_path)) throw RunnerError(kExitMissingFile, *library_path + " not found");
  return ReadIoSpec(options.artifact_dir);
}

std::unique_ptr<Model> LoadModel(const BenchOptions& options, const std::string& library_path, const IoSpec& io,
                                 BenchResult* result) {
  const auto start = Clock::now();
  std::unique_ptr<Model> model = Model::Load(library_path, options.entry);
  result->load_ms = MsSince(start);
  result->library_kind = model->kind();
  if (options.per_kernel && !model->is_vm()) {
    throw RunnerError(kExitUsage, "--per-kernel needs a Relax VM executable; " + library_path +
                                      " is a plain kernel library");
  }
  const int arity = model->EntryArity();
  if (arity >= 0 && arity != static_cast<int>(io.inputs.size())) {
    throw RunnerError(kExitMismatch, "'" + options.entry + "' takes " + std::to_string(arity) +
                                         " inputs, io.txt lists " + std::to_string(io.inputs.size()));
  }
  Log("loaded " + library_path + " (" + result->library_kind + ") in " + std::to_string(result->load_ms) + " ms");
  return model;
}

// Collection on for the lifetime of this object (callgrind only; a no-op otherwise).
class CallgrindCollect {
 public:
  CallgrindCollect() {
#ifdef AGOC_HAVE_CALLGRIND
    CALLGRIND_ZERO_STATS;
    CALLGRIND_TOGGLE_COLLECT;
#endif
  }
  ~CallgrindCollect() {
#ifdef AGOC_HAVE_CALLGRIND
    CALLGRIND_TOGGLE_COLLECT;
#endif
  }
  CallgrindCollect(const CallgrindCollect&) = delete;
  CallgrindCollect& operator=(const CallgrindCollect&) = delete;
};

// N warm-up calls, then M timed calls, more while the samples add up to less than --min-time-ms.
// Returns the outputs of the last call.
std::vector<ffi::Tensor> TimeRuns(Model* model, const std::vector<ffi::Tensor>& inputs,
                                  const std::vector<ffi::Tensor>& destinations, const BenchOptions& options,
                                  std::vector<double>* samples_ms) {
  for (int i = 0; i < options.warmup; ++i) RunOnce(model, inputs, destinations, "warm-up", i);
  std::vector<ffi::Tensor> outputs;
  double total_ms = 0;
  const CallgrindCollect collect;  // only the timed calls
  for (int i = 0; i < options.repeat || total_ms < options.min_time_ms; ++i) {
    const auto start = Clock::now();
    outputs = RunOnce(model, inputs, destinations, "timed", i);
    samples_ms->push_back(MsSince(start));
    total_ms += samples_ms->back();
  }
  return outputs;
}

// M more calls with the VM instrument timing each kernel (after the samples, so they are unperturbed).
std::vector<KernelTimer::Summary> TimeKernels(Model* model, KernelTimer* timer,
                                              const std::vector<ffi::Tensor>& inputs, const BenchOptions& options) {
  model->InstrumentKernels(timer);
  for (int i = 0; i < options.repeat; ++i) {
    RunOnce(model, inputs, {}, "per-kernel", i);
    timer->EndRun();
  }
  return timer->Summarize();
}

}  // namespace

BenchResult RunBench(const BenchOptions& options) {
  BenchResult result;
  result.options = options;
  KernelTimer timer;  // outlives the model, whose VM instrument may point at it
  std::string library_path;
  const IoSpec io = OpenArtifact(options, &library_path);
  const std::vector<HostTensor> host_inputs = LoadInputs(options, io);
  PrepareOutputsDir(options.outputs_dir);
  result.cores = options.cores.empty() ? AllowedCores() : options.cores;  // before the pool pins this thread
  SetThreadEnvironment(options);

  std::unique_ptr<Model> model = LoadModel(options, library_path, io, &result);
  ConfigureThreadPool(options);
  std::vector<ffi::Tensor> inputs, destinations;
  for (const HostTensor& host : host_inputs) inputs.push_back(ToDeviceTensor(host));
  if (!model->is_vm()) {
    for (const TensorSpec& spec : io.outputs) destinations.push_back(EmptyTensor(spec));
  }

  const std::vector<ffi::Tensor> outputs = TimeRuns(model.get(), inputs, destinations, options, &result.samples_ms);
  result.cpu_freqs = ReadCpuFreqs();  // right after the timed runs, while the cores are busy-clocked
  result.thermal = ReadThermalZones();
  result.stats = Summarize(result.samples_ms);
  result.outputs = RecordOutputs(outputs, io, options.outputs_dir);
  Log("timed " + std::to_string(result.samples_ms.size()) + " runs, median " +
      std::to_string(result.stats.median_ms) + " ms");
  result.threads = RuntimeThreads(options);
  if (options.per_kernel) {
    result.kernels = TimeKernels(model.get(), &timer, inputs, options);
    result.peak = MeasurePeak(result.threads);  // what a kernel's GFLOP/s compares with, on as many threads
  }
  return result;
}

void WriteBenchJson(const BenchResult& r, std::ostream& os) {
  JsonWriter j(os);
  j.BeginObject();
  j.Key("schema").String("agoc.runner.bench/1");
  j.Key("artifact").String(r.options.artifact_dir);
  j.Key("library").String(r.library_kind);
  j.Key("entry").String(r.options.entry);
  j.Key("inputs").String(r.options.random_inputs ? "random" : "files");
  if (r.options.random_inputs) j.Key("seed").Int(static_cast<int64_t>(r.options.seed));
  j.Key("warmup").Int(r.options.warmup);
  j.Key("repeat").Int(r.options.repeat);
  j.Key("min_time_ms").Double(r.options.min_time_ms);
  j.Key("load_ms").Double(r.load_ms);
  j.Key("samples_ms").DoubleArray(r.samples_ms);
  j.Key("mean_ms").Double(r.stats.mean_ms);
  j.Key("median_ms").Double(r.stats.median_ms);
  j.Key("min_ms").Double(r.stats.min_ms);
  j.Key("max_ms").Double(r.stats.max_ms);
  j.Key("std_ms").Double(r.stats.std_ms);
  j.Key("threads").Int(r.threads);
  j.Key("cores").IntArray(r.cores);
  j.Key("cpu_freq_khz").BeginObject();
  for (const CpuFreq& f : r.cpu_freqs) j.Key("cpu" + std::to_string(f.cpu)).Int(f.khz);
  j.EndObject();
  j.Key("thermal_c").BeginObject();
  for (const ThermalZone& z : r.thermal) j.Key(z.zone).Double(z.celsius, 6);
  j.EndObject();
  j.Key("thermal_types").BeginObject();
  for (const ThermalZone& z : r.thermal) j.Key(z.zone).String(z.type);
  j.EndObject();
  j.Key("outputs").BeginArray();
  for (const OutputRecord& o : r.outputs) {
    j.BeginObject();
    j.Key("name").String(o.spec.name);
    j.Key("dtype").String(o.spec.dtype);
    j.Key("shape").IntArray(o.spec.shape);
    j.Key("checksum").BeginObject();
    j.Key("sum").Double(o.checksum.sum, 17);
    j.Key("sum_abs").Double(o.checksum.sum_abs, 17);
    j.EndObject();
    if (!o.file.empty()) j.Key("file").String(o.file);
    j.EndObject();
  }
  j.EndArray();
  if (r.options.per_kernel) {
    j.Key("kernels").BeginArray();
    for (const KernelTimer::Summary& k : r.kernels) {
      j.BeginObject();
      j.Key("name").String(k.name);
      j.Key("calls_per_run").Double(k.calls_per_run, 6);
      j.Key("median_ms").Double(k.median_ms);
      j.Key("min_ms").Double(k.min_ms);
      j.EndObject();
    }
    j.EndArray();
    j.Key("peak").BeginObject();
    j.Key("gflops").Double(r.peak.gflops, 6);
    j.Key("isa").String(r.peak.isa);
    j.Key("threads").Int(r.peak.threads);
    j.EndObject();
  }
  j.EndObject();
  os << '\n';
}

}  // namespace agoc
