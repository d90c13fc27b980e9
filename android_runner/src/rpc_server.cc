#include "rpc_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "errors.h"
#include "json.h"
#include "sysinfo.h"

namespace agoc {
namespace ffi = tvm::ffi;

namespace {

// TVM's RPC handshake constants (python/tvm/rpc/base.py: RPC_MAGIC, RPC_CODE_*).
constexpr int32_t kRpcMagic = 0xff271;
constexpr int32_t kRpcCodeSuccess = kRpcMagic + 0;
constexpr int32_t kRpcCodeMismatch = kRpcMagic + 2;
constexpr int32_t kMaxKeyLength = 4096;

volatile sig_atomic_t g_stop = 0;     // SIGINT / SIGTERM
volatile sig_atomic_t g_expired = 0;  // SIGALRM: the session's -timeout passed

void Log(const std::string& message) { std::cerr << "agoc-runner rpc: " << message << std::endl; }

// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = other.Release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }

  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

bool SendAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The handshake's integers are 4-byte little-endian (struct "<i" on the Python side).
bool SendInt32(int fd, int32_t value) {
  uint8_t bytes[4];
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(static_cast<uint32_t>(value) >> (8 * i));
  return SendAll(fd, bytes, 4);
}

bool RecvInt32(int fd, int32_t* value) {
  uint8_t bytes[4];
  if (!RecvAll(fd, bytes, 4)) return false;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(bytes[i]) << (8 * i);
  *value = static_cast<int32_t>(v);
  return true;
}

Fd Listen(const RpcOptions& options, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(options.host.c_str(), nullptr, &hints, &found); rc != 0) {
    throw RunnerError(kExitSocket, "cannot resolve --host " + options.host + ": " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> address(found, &freeaddrinfo);
  Fd sock(socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) throw RunnerError(kExitSocket, std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int last = options.port == 0 ? 0 : options.port_end;
  int error = 0;
  for (int port = options.port; port <= last; ++port) {
    sockaddr_storage addr{};
    std::memcpy(&addr, found->ai_addr, found->ai_addrlen);
    if (found->ai_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
    }
    if (bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), found->ai_addrlen) == 0) {
      if (listen(sock.get(), 8) != 0) throw RunnerError(kExitSocket, std::string("listen: ") + std::strerror(errno));
      sockaddr_storage bound{};
      socklen_t length = sizeof(bound);
      getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &length);
      *bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                      : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      return sock;
    }
    error = errno;
    if (error != EADDRINUSE) break;
  }
  throw RunnerError(kExitSocket, "cannot bind " + options.host + " on ports " + std::to_string(options.port) + ".." +
                                     std::to_string(last) + ": " + std::strerror(error));
}

// What a client asked for in its key string after "client:<key>", e.g. "-timeout=60".
struct SessionRequest {
  double timeout_s = 0;  // 0: none
};

// TVM's server side of the handshake (python/tvm/rpc/server.py `_accept_conn`, apps/cpp_rpc):
//   client -> RPC_MAGIC (int32), key length (int32), key bytes "client:<key>[ -timeout=N]"
//   server -> RPC_CODE_MISMATCH and close, when the first token is not "client:<key>"
//   server -> RPC_CODE_SUCCESS, length of "server:<key>" (int32), its bytes
// Returns false (after logging) for a peer that is not a matching TVM RPC client.
bool Handshake(int fd, const std::string& key, SessionRequest* request) {
  int32_t magic = 0, length = 0;
  if (!RecvInt32(fd, &magic) || magic != kRpcMagic) {
    Log("dropped a connection that is not a TVM RPC client (bad magic)");
    return false;
  }
  if (!RecvInt32(fd, &length) || length < 0 || length > kMaxKeyLength) {
    Log("dropped a client with a bad key length");
    return false;
  }
  std::string client_key(static_cast<size_t>(length), '\0');
  if (length > 0 && !RecvAll(fd, &client_key[0], client_key.size())) return false;
  std::istringstream tokens(client_key);
  std::string first, option;
  tokens >> first;
  if (first != "client:" + key) {
    SendInt32(fd, kRpcCodeMismatch);
    Log("refused a client with a wrong key");
    return false;
  }
  while (tokens >> option) {
    if (option.rfind("-timeout=", 0) == 0) request->timeout_s = std::atof(option.c_str() + 9);
  }
  const std::string server_key = "server:" + key;
  return SendInt32(fd, kRpcCodeSuccess) && SendInt32(fd, static_cast<int32_t>(server_key.size())) &&
         SendAll(fd, server_key.data(), server_key.size());
}

// What the device says about its state right now, as one JSON object: its name (env
// AGOC_DEVICE_NAME, set by whoever started the server), the cpus' current frequencies and the
// thermal zones' temperatures (empty objects where sysfs hides them). The host reads it before
// and after each measurement to spot throttled samples.
std::string SysInfoJson() {
  std::ostringstream out;
  JsonWriter j(out);
  j.BeginObject();
  const char* name = std::getenv("AGOC_DEVICE_NAME");
  j.Key("device").String(name ? name : "");
  j.Key("cpu_freq_khz").BeginObject();
  for (const CpuFreq& f : ReadCpuFreqs()) j.Key("cpu" + std::to_string(f.cpu)).Int(f.khz);
  j.EndObject();
  j.Key("thermal_c").BeginObject();
  for (const ThermalZone& z : ReadThermalZones()) j.Key(z.zone).Double(z.celsius, 6);
  j.EndObject();
  j.EndObject();
  return out.str();
}

// The functions a TVM RPC server provides on top of the runtime's own (python/tvm/rpc/server.py
// `_server_env`): files the client uploads go to the session dir; load_module loads one of them.
// Plus agoc.sysinfo (see SysInfoJson).
void RegisterSessionEnvironment(const std::string& session_dir) {
  ffi::Function::SetGlobal("agoc.sysinfo", ffi::Function::FromTyped([]() -> ffi::String { return SysInfoJson(); }),
                           true);
  auto workpath = [session_dir](const ffi::String& name) -> ffi::String {
    return ffi::String(session_dir + "/" + std::string(name));
  };
  ffi::Function::SetGlobal("tvm.rpc.server.workpath", ffi::Function::FromTyped(workpath), true);
  ffi::Function::SetGlobal("tvm.rpc.server.load_module",
                           ffi::Function::FromTyped([workpath](const ffi::String& name) -> ffi::Module {
                             const std::string path = workpath(name);
                             Log("load_module " + path);
                             return ffi::Module::LoadFromFile(path);
                           }),
                           true);
}

[[noreturn]] void RunSessionChild(int conn, const std::string& session_dir) {
  int code = 0;
  try {
    if (chdir(session_dir.c_str()) != 0) throw RunnerError(kExitRun, "cannot enter " + session_dir);
    RegisterSessionEnvironment(session_dir);
    auto server_loop = ffi::Function::GetGlobal("rpc.ServerLoop");
    if (!server_loop) throw RunnerError(kExitLoad, "the runtime has no rpc.ServerLoop (built without USE_RPC?)");
    (*server_loop)(static_cast<int64_t>(conn));  // closes `conn` when the client hangs up
  } catch (const ffi::Error& error) {
    Log("session failed: " + error.kind() + ": " + error.message());
    code = kExitRun;
  } catch (const RunnerError& error) {
    Log(error.what());
    code = error.code();
  } catch (const std::exception& error) {
    Log(std::string("session failed: ") + error.what());
    code = kExitRun;
  }
  std::cerr.flush();
  _exit(code);
}

std::string MakeSessionDir(const std::string& base) {
  std::string pattern = base + "/agoc-rpc-XXXXXX";
  if (mkdtemp(&pattern[0]) == nullptr) {
    throw RunnerError(kExitRun, "cannot create a session dir under " + base + ": " + std::strerror(errno));
  }
  return pattern;
}

// Runs one session in a child process (a crashing kernel takes down only the session) and waits
// for it, killing it when the client's -timeout passes or the server is asked to stop.
int ServeSession(Fd conn, const Fd& listener, const std::string& work_base, const SessionRequest& request) {
  const std::string session_dir = MakeSessionDir(work_base);
  std::cout.flush();
  std::cerr.flush();
  const pid_t child = fork();
  if (child < 0) throw RunnerError(kExitRun, std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    close(listener.get());
    RunSessionChild(conn.Release(), session_dir);
  }
  conn.Close();
  g_expired = 0;
  if (request.timeout_s > 0) alarm(static_cast<unsigned>(std::ceil(request.timeout_s)));
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) break;
    if (g_stop || g_expired) {
      Log(g_expired ? "session timed out, killing it" : "stopping, killing the session");
      kill(child, SIGKILL);
    }
  }
  alarm(0);
  std::error_code ignored;
  std::filesystem::remove_all(session_dir, ignored);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  Log(ok ? "session finished" : "session ended abnormally (status " + std::to_string(status) + ")");
  return ok ? kExitOk : kExitRun;
}

void OnSignal(int signal) {
  if (signal == SIGALRM) {
    g_expired = 1;
  } else {
    g_stop = 1;
  }
}

void InstallSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: accept() and waitpid() return EINTR
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGALRM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::string DefaultWorkBase() {
  if (const char* tmp = std::getenv("TMPDIR"); tmp && *tmp) return tmp;
  std::error_code ignored;
  if (std::filesystem::is_directory("/data/local/tmp", ignored)) return "/data/local/tmp";  // Android
  return "/tmp";
}

}  // namespace

int RunRpcServer(const RpcOptions& options) {
  const std::string work_base = options.work_dir.empty() ? DefaultWorkBase() : options.work_dir;
  std::error_code error;
  if (!std::filesystem::is_directory(work_base, error)) {
    throw RunnerError(kExitMissingFile, "--work-dir " + work_base + " is not a directory");
  }
  InstallSignalHandlers();
  int port = 0;
  Fd listener = Listen(options, &port);
  {
    JsonWriter json(std::cout);
    json.BeginObject().Key("listening").Int(port).Key("host").String(options.host).Key("pid").Int(getpid());
    json.EndObject();
    std::cout << std::endl;
  }
  Log("listening on " + options.host + ":" + std::to_string(port));  // never the key: logs get shared
  while (!g_stop) {
    Fd conn(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      throw RunnerError(kExitSocket, std::string("accept: ") + std::strerror(errno));
    }
    SessionRequest request;
    if (!Handshake(conn.get(), options.key, &request)) continue;
    Log("session started");
    const int code = ServeSession(std::move(conn), listener, work_base, request);
    if (options.once) return code;
  }
  return kExitOk;
}

}  // namespace agoc
