#include "tensor_io.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace agoc {
namespace {

struct DTypeRow {
  const char* name;
  uint8_t code;
  uint8_t bits;
};

// The dtypes the runner reads, writes and checksums.
constexpr DTypeRow kDTypes[] = {
    {"float32", kDLFloat, 32}, {"float16", kDLFloat, 16}, {"float64", kDLFloat, 64},
    {"bfloat16", kDLBfloat, 16}, {"int8", kDLInt, 8},     {"int16", kDLInt, 16},
    {"int32", kDLInt, 32},     {"int64", kDLInt, 64},     {"uint8", kDLUInt, 8},
    {"uint16", kDLUInt, 16},   {"uint32", kDLUInt, 32},   {"uint64", kDLUInt, 64},
    {"bool", kDLBool, 8},
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecode(const std::string& text, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    int hi = i + 2 < text.size() ? HexValue(text[i + 1]) : -1;
    int lo = i + 2 < text.size() ? HexValue(text[i + 2]) : -1;
    if (hi < 0 || lo < 0) throw RunnerError(kExitMismatch, where + ": bad percent-escape in name '" + text + "'");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

std::vector<int64_t> ParseShape(const std::string& text, const std::string& where) {
  std::vector<int64_t> shape;
  if (text == "scalar") return shape;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    long long dim = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || dim < 0) {
      throw RunnerError(kExitMismatch, where + ": bad shape '" + text + "'");
    }
    shape.push_back(dim);
  }
  return shape;
}

TensorSpec ParseSpecLine(const std::string& line, const std::string& where, std::string* kind) {
  std::istringstream fields(line);
  std::string name, shape, extra;
  TensorSpec spec;
  if (!(fields >> *kind >> name >> spec.dtype >> shape >> spec.file) || (fields >> extra)) {
    throw RunnerError(kExitMismatch,
                      where + ": expected 'input|output <name> <dtype> <d0,d1,...|scalar> <file>'");
  }
  if (*kind != "input" && *kind != "output") {
    throw RunnerError(kExitMismatch, where + ": first field must be 'input' or 'output', not '" + *kind + "'");
  }
  spec.name = PercentDecode(name, where);
  spec.dl_dtype = ParseDType(spec.dtype);
  spec.shape = ParseShape(shape, where);
  return spec;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

float BFloatToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

template <typename T>
T Load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

double ElementAsDouble(const DLDataType& t, const uint8_t* p) {
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return HalfToFloat(Load<uint16_t>(p));
      if (t.bits == 32) return Load<float>(p);
      return Load<double>(p);
    case kDLBfloat:
      return BFloatToFloat(Load<uint16_t>(p));
    case kDLInt:
      if (t.bits == 8) return Load<int8_t>(p);
      if (t.bits == 16) return Load<int16_t>(p);
      if (t.bits == 32) return Load<int32_t>(p);
      return static_cast<double>(Load<int64_t>(p));
    default:  // kDLUInt, kDLBool
      if (t.bits == 8) return Load<uint8_t>(p);
      if (t.bits == 16) return Load<uint16_t>(p);
      if (t.bits == 32) return Load<uint32_t>(p);
      return static_cast<double>(Load<uint64_t>(p));
  }
}

// float -> IEEE half, truncating (the random values it stores are exact in half precision).
uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const int32_t float_exponent = static_cast<int32_t>((bits >> 23) & 0xffu);
  const uint32_t mantissa = bits & 0x7fffffu;
  const int32_t exponent = float_exponent - 127 + 15;
  if (float_exponent == 0 || exponent < -10) return sign;
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exponent <= 0) return static_cast<uint16_t>(sign | ((mantissa | 0x800000u) >> (14 - exponent)));
  return static_cast<uint16_t>(sign | (exponent << 10) | (mantissa >> 13));
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Stores `value` (a float in [-1,1) or a small integer) as one element of type t.
void StoreElement(const DLDataType& t, double value, uint8_t* p) {
  auto store = [p](auto v) { std::memcpy(p, &v, sizeof(v)); };
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return store(static_cast<float>(value));
      if (t.bits == 64) return store(value);
      return store(FloatToHalf(static_cast<float>(value)));
    case kDLBfloat: {
      float f = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      return store(static_cast<uint16_t>(bits >> 16));
    }
    case kDLInt:
      if (t.bits == 8) return store(static_cast<int8_t>(value));
      if (t.bits == 16) return store(static_cast<int16_t>(value));
      if (t.bits == 32) return store(static_cast<int32_t>(value));
      return store(static_cast<int64_t>(value));
    default:
      if (t.bits == 8) return store(static_cast<uint8_t>(value));
      if (t.bits == 16) return store(static_cast<uint16_t>(value));
      if (t.bits == 32) return store(static_cast<uint32_t>(value));
      return store(static_cast<uint64_t>(value));
  }
}

}  // namespace

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorSpec::NumBytes() const {
  return static_cast<size_t>(NumElements()) * ((dl_dtype.bits * dl_dtype.lanes + 7) / 8);
}

std::string TensorSpec::ShapeText() const {
  if (shape.empty()) return "scalar";
  std::string text;
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "x" : "") + std::to_string(shape[i]);
  return text;
}

DLDataType ParseDType(const std::string& name) {
  for (const DTypeRow& row : kDTypes) {
    if (name == row.name) return DLDataType{row.code, row.bits, 1};
  }
  std::string known;
  for (const DTypeRow& row : kDTypes) known += std::string(known.empty() ? "" : ", ") + row.name;
  throw RunnerError(kExitMismatch, "unsupported dtype '" + name + "' (known: " + known + ")");
}

IoSpec ReadIoSpec(const std::string& artifact_dir) {
  const std::string path = JoinPath(artifact_dir, "io.txt");
  std::ifstream file(path);
  if (!file) {
    throw RunnerError(kExitMissingFile, path + " not found: not an agoc artifact (recompile with `agoc compile`)");
  }
  IoSpec spec;
  std::string line, kind;
  for (int number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    TensorSpec tensor = ParseSpecLine(line, path + ":" + std::to_string(number), &kind);
    (kind == "input" ? spec.inputs : spec.outputs).push_back(std::move(tensor));
  }
  if (spec.outputs.empty()) throw RunnerError(kExitMismatch, path + " lists no outputs");
  return spec;
}

HostTensor ReadTensorFile(const std::string& artifact_dir, const TensorSpec& spec) {
  const std::string path = JoinPath(artifact_dir, spec.file);
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw RunnerError(kExitMissingFile, "input '" + spec.name + "': " + path + " not found");
  const auto size = static_cast<size_t>(file.tellg());
  if (size != spec.NumBytes()) {
    throw RunnerError(kExitMismatch, "input '" + spec.name + "': " + path + " has " + std::to_string(size) +
                                         " bytes, but " + spec.dtype + " " + spec.ShapeText() + " needs " +
                                         std::to_string(spec.NumBytes()));
  }
  HostTensor tensor{spec, std::vector<uint8_t>(size)};
  file.seekg(0);
  if (size && !file.read(reinterpret_cast<char*>(tensor.bytes.data()), static_cast<std::streamsize>(size))) {
    throw RunnerError(kExitMissingFile, "input '" + spec.name + "': could not read " + path);
  }
  return tensor;
}

HostTensor RandomTensor(const TensorSpec& spec, uint64_t seed) {
  HostTensor tensor{spec, std::vector<uint8_t>(spec.NumBytes())};
  const size_t width = (spec.dl_dtype.bits + 7) / 8;
  const bool is_float = spec.dl_dtype.code == kDLFloat || spec.dl_dtype.code == kDLBfloat;
  const bool is_bool = spec.dl_dtype.code == kDLBool;
  uint64_t state = seed;
  for (int64_t i = 0; i < spec.NumElements(); ++i) {
    uint64_t r = SplitMix64(&state);
    double value = is_float ? static_cast<double>(r >> 53) / 1024.0 - 1.0  // k/2^10 - 1 in [-1, 1)
                            : static_cast<double>((r >> 61) % (is_bool ? 2 : 8));
    StoreElement(spec.dl_dtype, value, tensor.bytes.data() + i * width);
  }
  return tensor;
}

Checksum ComputeChecksum(const HostTensor& tensor) {
  Checksum sum;
  const size_t width = (tensor.spec.dl_dtype.bits + 7) / 8;
  for (size_t offset = 0; offset + width <= tensor.bytes.size(); offset += width) {
    double value = ElementAsDouble(tensor.spec.dl_dtype, tensor.bytes.data() + offset);
    sum.sum += value;
    sum.sum_abs += std::fabs(value);
  }
  return sum;
}

void WriteTensorFile(const std::string& path, const HostTensor& tensor) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(tensor.bytes.data()), static_cast<std::streamsize>(tensor.bytes.size()));
  if (!file) throw RunnerError(kExitMissingFile, "could not write " + path);
}

std::string JoinPath(const std::string& dir, const std::string& relative) {
  if (relative.empty() || relative[0] == '/' || dir.empty()) return relative.empty() ? dir : relative;
  return dir.back() == '/' ? dir + relative : dir + "/" + relative;
}

bool FileExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool DirExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

}  // namespace agoc
