#include "options.h"

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "errors.h"

namespace agoc {
namespace {

const char kUsage[] = R"(agoc-runner: run agoc kernel libraries on a device.

usage:
  agoc-runner bench --artifact DIR [--warmup N] [--repeat M] [--min-time-ms T]
                    [--threads K] [--cores 4,5,6,7] [--random-inputs [--seed S]]
                    [--outputs-dir DIR] [--per-kernel] [--entry NAME]
  agoc-runner rpc [--host 127.0.0.1] [--port 9090] [--port-end 9199] [--key KEY (or env AGOC_RPC_KEY)]
                  [--once] [--work-dir DIR]
  agoc-runner --help

bench   loads DIR/model.so (a Relax VM executable, or a plain kernel library whose
        function --entry takes the inputs then the outputs), reads DIR/io.txt and the
        input files it names (or seeded random data), runs N warm-up runs (default 5),
        then M timed runs (default 20), continuing past M until the timed runs add up
        to T ms (default 0). Prints ONE JSON object on stdout; logs go to stderr.
          --threads K        runtime worker threads (sets TVM_NUM_THREADS)
          --cores LIST       pin the process and the runtime's workers to these cpus
          --random-inputs    splitmix64(seed) data: floats in [-1,1), ints in [0,8)
          --seed S           seed for --random-inputs (default 0)
          --outputs-dir DIR  also write each output as DIR/output_<i>.bin (raw LE)
          --per-kernel       after the timed runs, M more runs with a VM instrument:
                             per fused kernel (PrimFunc) calls per run and median ms;
                             then the FP32 FMA peak of as many threads (GFLOP/s)
          --entry NAME       function to call (default main)
rpc     a TVM RPC server: binds HOST (loopback by default) on the first free port in
        [--port, --port-end] (--port 0: any free port), prints {"listening": PORT, ...}
        on stdout, answers TVM's handshake (key "client:KEY" -> "server:KEY") and
        serves each session with the runtime's rpc.ServerLoop in a forked child, in a
        fresh work dir under --work-dir, one session after another (--once: just one).
        Clients: tvm.rpc.connect(host, port, key=KEY).

exit codes:
  0  ok
  2  bad flags or usage
  3  missing file (artifact dir, model.so, io.txt, an input file)
  4  library or Relax VM load failure
  5  input/output shape, dtype or size mismatch; malformed io.txt
  6  runtime error while running the model (rpc --once: the session failed)
  7  RPC socket error (bind, listen, accept)
)";

long long ParseInteger(const std::string& flag, const std::string& text, long long low, long long high) {
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < low || value > high) {
    throw RunnerError(kExitUsage, flag + " expects an integer in [" + std::to_string(low) + ", " +
                                      std::to_string(high) + "], got '" + text + "'");
  }
  return value;
}

double ParseNonNegative(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(value >= 0.0)) {
    throw RunnerError(kExitUsage, flag + " expects a non-negative number, got '" + text + "'");
  }
  return value;
}

std::vector<int> ParseCores(const std::string& text) {
  std::vector<int> cores;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) cores.push_back(static_cast<int>(ParseInteger("--cores", item, 0, 1023)));
  if (cores.empty()) throw RunnerError(kExitUsage, "--cores expects a list like 4,5,6,7");
  return cores;
}

// A flag table: name -> (takes a value?, what to do with it).
struct Flag {
  bool takes_value;
  std::function<void(const std::string&)> apply;
};

void ApplyFlags(const std::map<std::string, Flag>& flags, const std::string& mode, int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i], value;
    const size_t eq = arg.find('=');
    const bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto it = flags.find(arg);
    if (it == flags.end()) throw RunnerError(kExitUsage, "unknown flag for " + mode + ": '" + arg + "' (see --help)");
    if (it->second.takes_value && !inline_value) {
      if (i + 1 >= argc) throw RunnerError(kExitUsage, arg + " needs a value");
      value = argv[++i];
    } else if (!it->second.takes_value && inline_value) {
      throw RunnerError(kExitUsage, arg + " takes no value");
    }
    it->second.apply(value);
  }
}

BenchOptions ParseBench(int argc, char** argv) {
  BenchOptions o;
  const std::map<std::string, Flag> flags = {
      {"--artifact", {true, [&](const std::string& v) { o.artifact_dir = v; }}},
      {"--warmup", {true, [&](const std::string& v) { o.warmup = ParseInteger("--warmup", v, 0, 1000000); }}},
      {"--repeat", {true, [&](const std::string& v) { o.repeat = ParseInteger("--repeat", v, 1, 1000000); }}},
      {"--min-time-ms", {true, [&](const std::string& v) { o.min_time_ms = ParseNonNegative("--min-time-ms", v); }}},
      {"--threads", {true, [&](const std::string& v) { o.threads = ParseInteger("--threads", v, 1, 1024); }}},
      {"--cores", {true, [&](const std::string& v) { o.cores = ParseCores(v); }}},
      {"--random-inputs", {false, [&](const std::string&) { o.random_inputs = true; }}},
      {"--seed", {true, [&](const std::string& v) { o.seed = ParseInteger("--seed", v, 0, INT64_MAX); }}},
      {"--outputs-dir", {true, [&](const std::string& v) { o.outputs_dir = v; }}},
      {"--per-kernel", {false, [&](const std::string&) { o.per_kernel = true; }}},
      {"--entry", {true, [&](const std::string& v) { o.entry = v; }}},
  };
  ApplyFlags(flags, "bench", argc, argv);
  if (o.artifact_dir.empty()) throw RunnerError(kExitUsage, "bench needs --artifact DIR");
  return o;
}

RpcOptions ParseRpc(int argc, char** argv) {
  RpcOptions o;
  bool port_end_given = false;
  const std::map<std::string, Flag> flags = {
      {"--host", {true, [&](const std::string& v) { o.host = v; }}},
      {"--port", {true, [&](const std::string& v) { o.port = ParseInteger("--port", v, 0, 65535); }}},
      {"--port-end", {true, [&](const std::string& v) {
                        o.port_end = ParseInteger("--port-end", v, 1, 65535);
                        port_end_given = true;
                      }}},
      {"--key", {true, [&](const std::string& v) { o.key = v; }}},
      {"--once", {false, [&](const std::string&) { o.once = true; }}},
      {"--work-dir", {true, [&](const std::string& v) { o.work_dir = v; }}},
  };
  bool key_given = false;
  for (int i = 0; i < argc; ++i) key_given = key_given || std::string(argv[i]) == "--key";
  ApplyFlags(flags, "rpc", argc, argv);
  // a secret session key is better passed in the environment: argv is world-readable in /proc
  if (const char* env_key = std::getenv("AGOC_RPC_KEY"); !key_given && env_key && *env_key) o.key = env_key;
  if (o.host.empty()) throw RunnerError(kExitUsage, "--host must not be empty");
  if (o.key.find_first_of(" \t\n") != std::string::npos) throw RunnerError(kExitUsage, "--key must not contain spaces");
  if (!port_end_given && o.port > o.port_end) o.port_end = o.port;
  if (o.port != 0 && o.port_end < o.port) {
    throw RunnerError(kExitUsage, "--port-end (" + std::to_string(o.port_end) + ") is below --port (" +
                                      std::to_string(o.port) + ")");
  }
  return o;
}

}  // namespace

Command ParseCommandLine(int argc, char** argv) {
  Command command;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || (i == 1 && arg == "help")) return command;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "bench") {
    command.mode = Mode::kBench;
    command.bench = ParseBench(argc, argv);
  } else if (mode == "rpc") {
    command.mode = Mode::kRpc;
    command.rpc = ParseRpc(argc, argv);
  } else if (mode.empty()) {
    throw RunnerError(kExitUsage, "missing mode: bench or rpc (see --help)");
  } else {
    throw RunnerError(kExitUsage, "unknown mode '" + mode + "': expected bench or rpc (see --help)");
  }
  return command;
}

const char* UsageText() { return kUsage; }

}  // namespace agoc
