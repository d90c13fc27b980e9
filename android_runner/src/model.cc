#include "model.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "errors.h"

namespace agoc {
namespace ffi = tvm::ffi;

namespace {

constexpr int kDLCPUDevice = 1;      // kDLCPU
constexpr int kPooledAllocator = 2;  // relax.VirtualMachine.POOLED_ALLOCATOR

struct AlignedCpuAlloc {
  void AllocData(DLTensor* tensor) {
    void* data = nullptr;
    const size_t size = std::max<size_t>(ffi::GetDataSize(*tensor), 1);
    if (posix_memalign(&data, 64, size) != 0) throw std::bad_alloc();
    tensor->data = data;
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

void Flatten(const ffi::Any& value, std::vector<ffi::Tensor>* out) {
  if (auto tensor = value.as<ffi::Tensor>()) {
    out->push_back(*tensor);
  } else if (auto array = value.as<ffi::Array<ffi::Any>>()) {
    for (const ffi::Any& item : *array) Flatten(item, out);
  } else if (auto shape = value.as<ffi::Shape>()) {  // an ONNX Shape output: an int64 vector
    const int64_t length = static_cast<int64_t>(shape->size());
    ffi::Tensor tensor = ffi::Tensor::FromNDAlloc(AlignedCpuAlloc{}, ffi::ShapeView(&length, 1),
                                                  DLDataType{kDLInt, 64, 1}, DLDevice{kDLCPU, 0});
    if (length > 0) std::memcpy(tensor.data_ptr(), shape->data(), length * sizeof(int64_t));
    out->push_back(tensor);
  } else {
    TVM_FFI_THROW(TypeError) << "the model returned a value of type index " << value.type_index()
                             << ", not a tensor or a tuple of tensors";
  }
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string DescribeError(const ffi::Error& error) { return error.kind() + ": " + error.message(); }

// ELF e_machine values -> names, for a clear message when an artifact is for another CPU.
struct Machine {
  uint16_t id;
  const char* name;
};
constexpr Machine kMachines[] = {{3, "x86"}, {40, "arm"}, {62, "x86-64"}, {183, "aarch64"}};
#if defined(__aarch64__)
constexpr uint16_t kOwnMachine = 183;
#elif defined(__x86_64__)
constexpr uint16_t kOwnMachine = 62;
#else
constexpr uint16_t kOwnMachine = 0;  // unknown: let the loader decide
#endif

std::string MachineName(uint16_t id) {
  for (const Machine& m : kMachines) {
    if (m.id == id) return m.name;
  }
  return "machine " + std::to_string(id);
}

// Throws RunnerError(kExitLoad) when `path` is an ELF file for a different CPU than this runner.
void CheckElfMachine(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  unsigned char header[20] = {};
  if (!file.read(reinterpret_cast<char*>(header), sizeof(header))) return;
  if (std::memcmp(header, "\x7f" "ELF", 4) != 0) return;  // not ELF: let the loader say what it is
  const uint16_t machine = static_cast<uint16_t>(header[18] | (header[19] << 8));
  if (kOwnMachine != 0 && machine != kOwnMachine) {
    throw RunnerError(kExitLoad, path + " is built for " + MachineName(machine) + ", but this runner is " +
                                     MachineName(kOwnMachine) + ": compile the artifact for this device's target");
  }
}

}  // namespace

void KernelTimer::Begin(const std::string& name) { started_[name] = Clock::now(); }

void KernelTimer::End(const std::string& name) {
  auto start = started_.find(name);
  if (start == started_.end()) return;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start->second).count();
  auto [it, inserted] = kernels_.try_emplace(name);
  if (inserted) it->second.order = kernels_.size();
  it->second.calls += 1;
  it->second.run_ms += ms;
  started_.erase(start);
}

void KernelTimer::EndRun() {
  ++runs_;
  for (auto& [name, kernel] : kernels_) {
    kernel.per_run_ms.push_back(kernel.run_ms);
    kernel.run_ms = 0.0;
  }
}

std::vector<KernelTimer::Summary> KernelTimer::Summarize() const {
  std::vector<std::pair<size_t, Summary>> ordered;
  for (const auto& [name, kernel] : kernels_) {
    Summary summary;
    summary.name = name;
    summary.calls_per_run = runs_ ? static_cast<double>(kernel.calls) / runs_ : 0.0;
    summary.median_ms = Median(kernel.per_run_ms);
    if (!kernel.per_run_ms.empty()) {
      summary.min_ms = *std::min_element(kernel.per_run_ms.begin(), kernel.per_run_ms.end());
    }
    ordered.emplace_back(kernel.order, summary);
  }
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Summary> result;
  for (auto& item : ordered) result.push_back(std::move(item.second));
  return result;
}

std::unique_ptr<Model> Model::Load(const std::string& path, const std::string& entry) {
  CheckElfMachine(path);
  try {
    ffi::Module library = ffi::Module::LoadFromFile(path);
    std::optional<ffi::Module> vm;
    ffi::Optional<ffi::Function> function;
    if (auto load_executable = library->GetFunction("vm_load_executable", true)) {
      vm = (*load_executable)().cast<ffi::Module>();
      auto init = (*vm)->GetFunction("vm_initialization", false);
      if (!init) throw RunnerError(kExitLoad, path + ": the VM module has no vm_initialization");
      (*init)(kDLCPUDevice, 0, kPooledAllocator);
      function = (*vm)->GetFunction(entry, false);
    } else {
      function = library->GetFunction(entry, true);
    }
    if (!function) {
      throw RunnerError(kExitLoad, path + " has no function '" + entry + "' (pick one with --entry)");
    }
    return std::unique_ptr<Model>(new Model(library, vm, function.value(), entry));
  } catch (const ffi::Error& error) {
    throw RunnerError(kExitLoad, "cannot load " + path + ": " + DescribeError(error) +
                                     " (is it an agoc artifact for this runner's target?)");
  }
}

std::string Model::kind() const { return is_vm() ? "relax.VirtualMachine" : "kernel library"; }

std::vector<ffi::Tensor> Model::Run(const std::vector<ffi::Tensor>& inputs,
                                    const std::vector<ffi::Tensor>& destinations) {
  std::vector<ffi::AnyView> args(inputs.begin(), inputs.end());
  if (!is_vm()) args.insert(args.end(), destinations.begin(), destinations.end());
  ffi::Any result;
  entry_.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
  if (!is_vm()) return destinations;
  std::vector<ffi::Tensor> outputs;
  Flatten(result, &outputs);
  return outputs;
}

bool Model::IsKernel(const std::string& name) {
  auto it = is_kernel_.find(name);
  if (it != is_kernel_.end()) return it->second;
  // Compiled kernels live in the executable's imported library; VM builtins do not.
  const bool kernel = library_->ImplementsFunction(name, true);
  is_kernel_.emplace(name, kernel);
  return kernel;
}

void Model::InstrumentKernels(KernelTimer* timer) {
  if (!is_vm()) return;
  auto set_instrument = (*vm_)->GetFunction("set_instrument", false);
  if (!set_instrument) throw RunnerError(kExitLoad, "this VM has no set_instrument; --per-kernel is unavailable");
  // Called before and after every VM Call instruction: (func, symbol, before_run, ret, args...).
  ffi::Function instrument = ffi::Function::FromPacked([this, timer](ffi::PackedArgs args, ffi::Any* rv) {
    *rv = 0;  // VMInstrumentReturnKind::kNoOp
    const std::string name = args[1].cast<ffi::String>();
    if (!IsKernel(name)) return;
    if (args[2].cast<bool>()) {
      timer->Begin(name);
    } else {
      timer->End(name);
    }
  });
  (*set_instrument)(instrument);
}

int Model::EntryArity() {
  if (!is_vm()) return -1;
  auto arity = (*vm_)->GetFunction("get_function_arity", false);
  if (!arity) return -1;
  try {
    return (*arity)(entry_name_).cast<int>();
  } catch (const ffi::Error&) {
    return -1;
  }
}

ffi::Tensor EmptyTensor(const TensorSpec& spec) {
  return ffi::Tensor::FromNDAlloc(AlignedCpuAlloc{}, ffi::ShapeView(spec.shape.data(), spec.shape.size()),
                                  spec.dl_dtype, DLDevice{kDLCPU, 0});
}

ffi::Tensor ToDeviceTensor(const HostTensor& host) {
  ffi::Tensor tensor = EmptyTensor(host.spec);
  if (!host.bytes.empty()) std::memcpy(tensor.data_ptr(), host.bytes.data(), host.bytes.size());
  return tensor;
}

HostTensor ToHostTensor(const ffi::Tensor& tensor, const TensorSpec& spec) {
  const DLDataType dtype = tensor.dtype();
  const ffi::ShapeView shape = tensor.shape();
  const std::vector<int64_t> got(shape.begin(), shape.end());
  if (dtype.code != spec.dl_dtype.code || dtype.bits != spec.dl_dtype.bits || dtype.lanes != spec.dl_dtype.lanes ||
      got != spec.shape) {
    TensorSpec actual = spec;
    actual.shape = got;
    throw RunnerError(kExitMismatch, "output '" + spec.name + "': the model returned " +
                                         std::string(ffi::DLDataTypeToString(dtype)) + " " + actual.ShapeText() +
                                         ", io.txt says " + spec.dtype + " " + spec.ShapeText());
  }
  if (tensor.device().device_type != kDLCPU || !tensor.IsContiguous()) {
    throw RunnerError(kExitMismatch, "output '" + spec.name + "' is not a compact CPU tensor");
  }
  HostTensor host{spec, std::vector<uint8_t>(spec.NumBytes())};
  const auto* data = static_cast<const uint8_t*>(tensor.data_ptr()) + tensor.GetDLTensorPtr()->byte_offset;
  if (!host.bytes.empty()) std::memcpy(host.bytes.data(), data, host.bytes.size());
  return host;
}

}  // namespace agoc
