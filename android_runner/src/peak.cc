#include "peak.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace agoc {
namespace {

constexpr int kChains = 12;  // independent accumulators: more than FMA latency x pipes on the cores we target
std::atomic<float> g_sink{0.0f};

#if defined(__x86_64__)
__attribute__((target("avx512f"))) double Fma512(long iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * i);
  const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iters; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, c);
  }
  float s = 0.0f;
  for (int i = 0; i < kChains; ++i) s += _mm512_reduce_add_ps(acc[i]);
  g_sink = s;
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx2,fma"))) double Fma256(long iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-3f * i);
  const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iters; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, c);
  }
  float lanes[8], s = 0.0f;
  for (int i = 0; i < kChains; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float v : lanes) s += v;
  }
  g_sink = s;
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}
#elif defined(__aarch64__)
double FmaNeon(long iters) {
  float32x4_t acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = vdupq_n_f32(1.0f + 1e-3f * i);
  const float32x4_t m = vdupq_n_f32(0.9999999f), c = vdupq_n_f32(1e-7f);
  for (long n = 0; n < iters; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = vfmaq_f32(c, acc[i], m);
  }
  float s = 0.0f;
  for (int i = 0; i < kChains; ++i) s += vaddvq_f32(acc[i]);
  g_sink = s;
  return 2.0 * 4 * kChains * static_cast<double>(iters);
}
#endif

double FmaScalar(long iters) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = 1.0f + 1e-3f * i;
  for (long n = 0; n < iters; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * 0.9999999f + 1e-7f;
  }
  float s = 0.0f;
  for (float v : acc) s += v;
  g_sink = s;
  return 2.0 * kChains * static_cast<double>(iters);
}

using Kernel = double (*)(long);

Kernel Pick(std::string* isa) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return *isa = "avx512", Fma512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return *isa = "avx2", Fma256;
#elif defined(__aarch64__)
  return *isa = "neon", FmaNeon;
#endif
  *isa = "scalar";
  return FmaScalar;
}

// GFLOP/s of `threads` threads each running `iters` iterations.
double Run(Kernel kernel, int threads, long iters) {
  std::vector<std::thread> pool;
  std::vector<double> flops(threads, 0.0);
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { flops[t] = kernel(iters); });
  for (std::thread& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double total = 0.0;
  for (double f : flops) total += f;
  return seconds > 0 ? total / seconds * 1e-9 : 0.0;
}

}  // namespace

Peak MeasurePeak(int threads, double seconds) {
  Peak peak;
  peak.threads = threads > 0 ? threads : 1;
  const Kernel kernel = Pick(&peak.isa);
  long iters = 1 << 14;
  // grow the run until it takes a tenth of the time asked, then time three runs of the rest, keep the fastest
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    Run(kernel, peak.threads, iters);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (took >= seconds / 10 || iters > (1L << 40)) {
      iters = static_cast<long>(iters * (seconds / 4) / (took > 0 ? took : 1e-6)) + 1;
      break;
    }
    iters *= 4;
  }
  for (int round = 0; round < 3; ++round) {
    const double gflops = Run(kernel, peak.threads, iters);
    if (gflops > peak.gflops) peak.gflops = gflops;
  }
  return peak;
}

}  // namespace agoc
