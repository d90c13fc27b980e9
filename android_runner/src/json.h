// A small streaming JSON writer: enough for one result object, no dependencies.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace agoc {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& os) : os_(os) {}

  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }

  JsonWriter& Key(std::string_view key) {
    Separate();
    WriteString(key);
    os_ << ':';
    after_key_ = true;
    return *this;
  }

  JsonWriter& String(std::string_view value) {
    Separate();
    WriteString(value);
    return *this;
  }
  JsonWriter& Int(int64_t value) {
    Separate();
    os_ << value;
    return *this;
  }
  JsonWriter& Bool(bool value) {
    Separate();
    os_ << (value ? "true" : "false");
    return *this;
  }
  // Non-finite numbers become null (JSON has no NaN/Inf).
  JsonWriter& Double(double value, int significant_digits = 9) {
    Separate();
    if (!std::isfinite(value)) {
      os_ << "null";
      return *this;
    }
    char buffer[40];
    std::snprintf(buffer, sizeof(buffer), "%.*g", significant_digits, value);
    os_ << buffer;
    return *this;
  }

  template <typename T>
  JsonWriter& IntArray(const std::vector<T>& values) {
    BeginArray();
    for (const T& v : values) Int(static_cast<int64_t>(v));
    return EndArray();
  }
  JsonWriter& DoubleArray(const std::vector<double>& values, int significant_digits = 9) {
    BeginArray();
    for (double v : values) Double(v, significant_digits);
    return EndArray();
  }

 private:
  JsonWriter& Open(char bracket) {
    Separate();
    os_ << bracket;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& Close(char bracket) {
    first_.pop_back();
    os_ << bracket;
    return *this;
  }
  // Writes the comma between siblings; a value right after its key needs none.
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) os_ << ',';
    first_.back() = false;
  }
  void WriteString(std::string_view text) {
    os_ << '"';
    for (unsigned char c : text) {
      switch (c) {
        case '"': os_ << "\\\""; break;
        case '\\': os_ << "\\\\"; break;
        case '\n': os_ << "\\n"; break;
        case '\r': os_ << "\\r"; break;
        case '\t': os_ << "\\t"; break;
        default:
          if (c < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
            os_ << escaped;
          } else {
            os_ << c;
          }
      }
    }
    os_ << '"';
  }

  std::ostream& os_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace agoc
