// Command-line options of the two modes, parsed into plain structs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agoc {

struct BenchOptions {
  std::string artifact_dir;
  int warmup = 5;
  int repeat = 20;
  double min_time_ms = 0.0;   // keep timing past `repeat` runs until the samples add up to this
  int threads = 0;            // 0: the runtime's default (TVM_NUM_THREADS, else the cores it picks)
  std::vector<int> cores;     // empty: do not pin
  bool random_inputs = false;
  uint64_t seed = 0;
  std::string outputs_dir;    // empty: do not write output tensors
  bool per_kernel = false;
  std::string entry = "main"; // VM function (or, for a plain kernel library, the kernel) to call
};

struct RpcOptions {
  std::string host = "127.0.0.1";
  int port = 9090;      // 0: let the OS pick a free port
  int port_end = 9199;  // inclusive end of the search range
  std::string key;      // what clients must send as "client:<key>"
  bool once = false;    // serve one session, then exit
  std::string work_dir; // parent of the per-session temp dirs; empty: $TMPDIR or /data/local/tmp or /tmp
};

enum class Mode { kHelp, kBench, kRpc };

struct Command {
  Mode mode = Mode::kHelp;
  BenchOptions bench;
  RpcOptions rpc;
};

// Throws RunnerError(kExitUsage) with a one-line reason for anything it does not understand.
Command ParseCommandLine(int argc, char** argv);

const char* UsageText();

}  // namespace agoc
