// agoc-runner: bench mode (time an artifact, print one JSON object) and rpc mode (a TVM RPC server).
// Exit codes are listed in errors.h and in --help.
#include <iostream>

#include <tvm/ffi/error.h>

#include "bench.h"
#include "errors.h"
#include "options.h"
#include "rpc_server.h"

int main(int argc, char** argv) {
  using namespace agoc;
  try {
    const Command command = ParseCommandLine(argc, argv);
    switch (command.mode) {
      case Mode::kHelp:
        std::cout << UsageText();
        return kExitOk;
      case Mode::kBench:
        WriteBenchJson(RunBench(command.bench), std::cout);
        return kExitOk;
      case Mode::kRpc:
        return RunRpcServer(command.rpc);
    }
  } catch (const RunnerError& error) {
    std::cerr << "agoc-runner: error: " << error.what() << std::endl;
    if (error.code() == kExitUsage) std::cerr << "run `agoc-runner --help` for usage" << std::endl;
    return error.code();
  } catch (const tvm::ffi::Error& error) {
    std::cerr << "agoc-runner: error: " << error.kind() << ": " << error.message() << std::endl;
    return kExitRun;
  } catch (const std::exception& error) {
    std::cerr << "agoc-runner: error: " << error.what() << std::endl;
    return kExitRun;
  }
  return kExitOk;
}
