// A loaded kernel library and the function the runner calls, behind one small RAII class.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor_io.h"

namespace agoc {

// Per-kernel wall time, fed by the VM instrument; one "run" is one call of the entry function.
class KernelTimer {
 public:
  struct Summary {
    std::string name;
    double calls_per_run = 0.0;
    double median_ms = 0.0;  // median over runs of the kernel's total time in that run
    double min_ms = 0.0;
  };

  void Begin(const std::string& name);
  void End(const std::string& name);
  void EndRun();
  std::vector<Summary> Summarize() const;  // kernels in the order they first ran

 private:
  using Clock = std::chrono::steady_clock;
  struct Kernel {
    size_t order = 0;
    int64_t calls = 0;
    double run_ms = 0.0;             // this run so far
    std::vector<double> per_run_ms;  // one entry per finished run
  };
  std::map<std::string, Kernel> kernels_;
  std::map<std::string, Clock::time_point> started_;
  int runs_ = 0;
};

class Model {
 public:
  // Loads `path`: a Relax VM executable (it exposes "vm_load_executable"; the VM is set up on
  // cpu(0) with the pooled allocator, like relax.VirtualMachine) or a plain kernel library.
  // Throws RunnerError(kExitLoad) saying why.
  static std::unique_ptr<Model> Load(const std::string& path, const std::string& entry);

  bool is_vm() const { return vm_.has_value(); }
  std::string kind() const;

  // One call of the entry function. A VM returns its outputs; a plain kernel writes into
  // `destinations` (allocated by the caller from io.txt), which are then returned.
  // tvm::ffi::Error propagates to the caller.
  std::vector<tvm::ffi::Tensor> Run(const std::vector<tvm::ffi::Tensor>& inputs,
                                    const std::vector<tvm::ffi::Tensor>& destinations);

  // VM only: time every call of a compiled kernel (PrimFunc) from now on. `timer` must outlive
  // the model's runs.
  void InstrumentKernels(KernelTimer* timer);

  // Number of parameters of the entry function, when the VM can tell (-1 otherwise).
  int EntryArity();

 private:
  Model(tvm::ffi::Module library, std::optional<tvm::ffi::Module> vm, tvm::ffi::Function entry, std::string name)
      : library_(std::move(library)), vm_(std::move(vm)), entry_(std::move(entry)), entry_name_(std::move(name)) {}
  bool IsKernel(const std::string& name);

  tvm::ffi::Module library_;
  std::optional<tvm::ffi::Module> vm_;
  tvm::ffi::Function entry_;
  std::string entry_name_;
  std::unordered_map<std::string, bool> is_kernel_;
};

// Host bytes <-> runtime tensors (cpu(0), 64-byte aligned, compact).
tvm::ffi::Tensor ToDeviceTensor(const HostTensor& host);
tvm::ffi::Tensor EmptyTensor(const TensorSpec& spec);
// Copies `tensor` out after checking it against `spec` (RunnerError(kExitMismatch) on a difference).
HostTensor ToHostTensor(const tvm::ffi::Tensor& tensor, const TensorSpec& spec);

}  // namespace agoc
