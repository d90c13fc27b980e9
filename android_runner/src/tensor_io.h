// The artifact's io.txt and the raw tensor files it names.
//
// io.txt has one line per tensor:  input|output <percent-encoded name> <dtype> <d0,d1,...|scalar> <file>
// Tensor files are raw little-endian bytes in row-major order, nothing else.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

namespace agoc {

struct TensorSpec {
  std::string name;
  std::string dtype;           // as written in io.txt, e.g. "float32"
  DLDataType dl_dtype{};
  std::vector<int64_t> shape;  // empty for a scalar
  std::string file;            // relative to the artifact root

  int64_t NumElements() const;
  size_t NumBytes() const;
  std::string ShapeText() const;  // "1x3x16x16", or "scalar"
};

struct IoSpec {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

// Host-side bytes of one tensor, with what they are.
struct HostTensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

struct Checksum {
  double sum = 0.0;
  double sum_abs = 0.0;
};

// Known dtype names -> DLDataType; throws RunnerError(kExitMismatch) for an unknown name.
DLDataType ParseDType(const std::string& name);

// Reads DIR/io.txt. Missing file -> kExitMissingFile; malformed line -> kExitMismatch.
IoSpec ReadIoSpec(const std::string& artifact_dir);

// Reads one tensor file and checks its size against the spec (kExitMissingFile / kExitMismatch).
HostTensor ReadTensorFile(const std::string& artifact_dir, const TensorSpec& spec);

// Deterministic pseudo-random data (splitmix64, identical on every platform):
// floats uniform in [-1, 1), integers uniform in [0, 8), bools 0/1.
HostTensor RandomTensor(const TensorSpec& spec, uint64_t seed);

Checksum ComputeChecksum(const HostTensor& tensor);

// Writes raw little-endian bytes; throws RunnerError(kExitMissingFile) when the file can't be written.
void WriteTensorFile(const std::string& path, const HostTensor& tensor);

std::string JoinPath(const std::string& dir, const std::string& relative);
bool FileExists(const std::string& path);
bool DirExists(const std::string& path);

}  // namespace agoc
