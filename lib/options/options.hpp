// Run-time options: compiled-in defaults (CMake TRAY_DEFAULT_OPTIONS), then the environment
// variable TRAY_OPTIONS ("key=value,key=value", read at first use), then tray_option_set()
// calls; the last word wins. Nothing here allocates. An unknown key or a bad value is reported
// on stderr in one line and the previous value stays.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

enum class Option : unsigned {
  kStats,        // 1: dump statistics at exit
  kStatsFile,    // where dumps go ("" for stderr); %p stands for the pid
  kStatsFormat,  // kStatsText, kStatsJson or kStatsPrometheus
  kStatsSignal,  // signal number that triggers a dump; 0 for none
  kDebug,        // 1: debug mode (fills, checks); fixed once the allocator has started
  kDebugAbort,   // 1: a debug error aborts the process; 0: report, count and go on
  kProf,         // 1: sample allocations for heap profiles (see heap/sample_countdown.hpp)
  kProfSample,   // mean bytes allocated between two profiled allocations
  kGuardSample,  // mean bytes allocated between two guarded allocations; 0 for none
  kProfFinal,    // 1: write the heap profile at exit
  kProfSignal,   // signal number that writes the heap profile; 0 for none
  kProfFile,     // where heap profiles go ("" for stderr); %p: the pid, %n: the dump's number
  kProfPeak,     // 1: keep the profile of the highest live bytes, written at exit
  kProfLeaks,    // 1: report the sampled allocations still live at exit, by stack
  kGuardSlots,   // guarded blocks kept at once, live or freed (read at the first guarded one)
  kPurgeThread,  // 1: a helper thread gives memory back once its delay runs out (purge/purge.hpp)
  kStatsInterval,  // seconds between periodic dumps (on the purger's thread); 0 for none
  kSparseDelayMs,  // ms a class must take no new page before its sparse pages give back OS pages
  kOnlyExe,      // reports (stats*, prof*) only in a process whose executable has this name
  kMemoryLimit,  // bytes the allocator may hold from the OS; 0: none; kMemoryLimitAuto: the cgroup's
  kMemoryLimitAction,  // kLimitSoft or kLimitFail: what reaching memory_limit does
  kThp,          // kThpNever, kThpMadvise or kThpSystem: transparent huge pages (segment/segment.hpp)
  kCount,
};

// guard_slots' range: the guarded slots' table has room for this many (sample/guard.cpp).
inline constexpr int64_t kGuardSlotsMax = 1024;
inline constexpr int64_t kStatsText = 0;
inline constexpr int64_t kStatsJson = 1;
inline constexpr int64_t kStatsPrometheus = 2;
// memory_limit unset: the limit is the process's cgroup's, less a margin (stats/limit.hpp).
inline constexpr int64_t kMemoryLimitAuto = -1;
inline constexpr int64_t kLimitSoft = 0;
inline constexpr int64_t kLimitFail = 1;
// thp: MADV_NOHUGEPAGE on every region, MADV_HUGEPAGE on the regions of small-block pages, or
// no advice (the kernel's /sys/kernel/mm/transparent_hugepage/enabled decides).
inline constexpr int64_t kThpNever = 0;
inline constexpr int64_t kThpMadvise = 1;
inline constexpr int64_t kThpSystem = 2;

// The value of an option (reading TRAY_OPTIONS on first use).
int64_t option(Option which);
// The text of a path option (stats_file, prof_file); "" when unset.
const char* option_path(Option which);
inline const char* option_stats_file() { return option_path(Option::kStatsFile); }

// debug=1, as read at the allocator's first use: from then on tray_option_set cannot change it.
// Inline, since every slow path asks: one load once decided.
extern constinit std::atomic<int> g_debug_latched;  // -1 until decided, then 0 or 1
bool debug_mode_decide();
TRAY_INLINE bool debug_mode() {
  const int value = g_debug_latched.load(std::memory_order_relaxed);
  if (TRAY_LIKELY(value >= 0)) return value != 0;
  return debug_mode_decide();
}

// tray_option_set: 0, EINVAL (unknown name or bad value; a warning is printed) or EBUSY (the
// option is fixed at start and the allocator has already read it).
int option_set(const char* name, const char* value);

// A file option's pattern with %p replaced by the pid, %n by `number` and %% by %, into
// out[capacity]; false if it does not fit.
bool expand_path(const char* pattern, uint64_t number, char* out, size_t capacity);

// Installs `handler` for the signal that option `which` names when it is not *installed (the
// signal installed before, updated); a warning on stderr if that fails.
void install_signal_option(Option which, int* installed, void (*handler)(int));

}  // namespace tray
