// The FP32 multiply-add peak of this CPU as the runner sees it: independent vector FMAs on every thread.
#pragma once

#include <string>

namespace agoc {

struct Peak {
  double gflops = 0.0;  // all threads together
  std::string isa;      // the vector unit measured: "avx512", "avx2", "neon", "scalar"
  int threads = 0;
};

// Runs `threads` threads of independent FMA chains for about `seconds` in all.
Peak MeasurePeak(int threads, double seconds = 0.3);

}  // namespace agoc
