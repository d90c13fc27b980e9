// rpc mode: a TVM RPC server. The socket, the handshake and the session processes are ours;
// each session's protocol is the runtime's own rpc.ServerLoop.
#pragma once

#include "options.h"

namespace agoc {

// Serves until killed (SIGINT/SIGTERM end it cleanly), or after one session with --once.
// Returns the exit code; throws RunnerError(kExitSocket) when it cannot listen.
int RunRpcServer(const RpcOptions& options);

}  // namespace agoc
