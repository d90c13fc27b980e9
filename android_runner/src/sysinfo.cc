#include "sysinfo.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "errors.h"

namespace agoc {
namespace {

bool ReadFirstToken(const std::string& path, std::string* out) {
  std::ifstream file(path);
  return static_cast<bool>(file >> *out);
}

// Names in `dir` that start with `prefix` followed by a number, sorted by that number.
std::vector<std::pair<int, std::string>> NumberedEntries(const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<int, std::string>> entries;
  DIR* handle = opendir(dir.c_str());
  if (!handle) return entries;
  while (dirent* entry = readdir(handle)) {
    std::string name = entry->d_name;
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    entries.emplace_back(std::stoi(digits), name);
  }
  closedir(handle);
  std::sort(entries.begin(), entries.end());
  return entries;
}

}  // namespace

void PinToCores(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string list;
  for (int core : cores) {
    CPU_SET(core, &set);
    list += (list.empty() ? "" : ",") + std::to_string(core);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    throw RunnerError(kExitUsage, "cannot pin to cores " + list + ": " + std::strerror(errno) +
                                      " (does this device have them? see /sys/devices/system/cpu/online)");
  }
}

std::vector<int> AllowedCores() {
  std::vector<int> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
  }
  return cores;
}

std::vector<CpuFreq> ReadCpuFreqs() {
  std::vector<CpuFreq> freqs;
  const std::string root = "/sys/devices/system/cpu";
  for (const auto& [cpu, name] : NumberedEntries(root, "cpu")) {
    std::string text;
    if (!ReadFirstToken(root + "/" + name + "/cpufreq/scaling_cur_freq", &text)) continue;
    char* end = nullptr;
    long long khz = std::strtoll(text.c_str(), &end, 10);
    if (*end == '\0') freqs.push_back({cpu, khz});
  }
  return freqs;
}

std::vector<ThermalZone> ReadThermalZones() {
  std::vector<ThermalZone> zones;
  const std::string root = "/sys/class/thermal";
  for (const auto& [index, name] : NumberedEntries(root, "thermal_zone")) {
    std::string temp, type = "unknown";
    if (!ReadFirstToken(root + "/" + name + "/temp", &temp)) continue;
    ReadFirstToken(root + "/" + name + "/type", &type);
    char* end = nullptr;
    double milli = std::strtod(temp.c_str(), &end);
    if (*end == '\0') zones.push_back({name, type, milli / 1000.0});
  }
  return zones;
}

}  // namespace agoc
