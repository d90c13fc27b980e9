// Exit codes and the one exception type the runner throws. Every failure that reaches main
// carries the exit code that names its kind, so callers can tell a bad flag from a bad model.
#pragma once

#include <stdexcept>
#include <string>

namespace agoc {

enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 2,        // unknown or malformed flag, missing mode, bad value
  kExitMissingFile = 3,  // artifact dir, model.so, io.txt or a tensor file does not exist
  kExitLoad = 4,         // the library or the Relax VM inside it could not be loaded
  kExitMismatch = 5,     // io.txt malformed, tensor file size or output shape/dtype mismatch
  kExitRun = 6,          // the model raised an error while running (or an RPC session failed)
  kExitSocket = 7,       // RPC: could not bind/listen/accept
};

class RunnerError : public std::runtime_error {
 public:
  RunnerError(ExitCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

}  // namespace agoc
