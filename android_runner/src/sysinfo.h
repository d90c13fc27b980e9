// What the device says about itself: cpu affinity, frequencies, temperatures (Linux/Android sysfs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agoc {

struct CpuFreq {
  int cpu;
  int64_t khz;
};

struct ThermalZone {
  std::string zone;  // "thermal_zone0"
  std::string type;  // contents of .../type, e.g. "cpu-0-0-usr"
  double celsius;
};

// sched_setaffinity for the calling thread (threads created later inherit it).
// Throws RunnerError(kExitUsage) naming the cores when the kernel refuses.
void PinToCores(const std::vector<int>& cores);

// The cpus this process may run on.
std::vector<int> AllowedCores();

// scaling_cur_freq of every cpu whose file is readable (often none inside containers).
std::vector<CpuFreq> ReadCpuFreqs();

// Every readable thermal zone; temp is in millidegrees on Linux and Android.
std::vector<ThermalZone> ReadThermalZones();

}  // namespace agoc
