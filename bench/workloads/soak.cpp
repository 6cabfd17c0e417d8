// soak: what a long-running server's memory looks like after its request mix has changed
// many times. Threads (2 by default) keep a live set (48 MiB by default, shared among them)
// and keep replacing random blocks of it, while the sizes they ask for move through bands,
// one per phase: small (8 B - 256 B), medium (256 B - 16 KiB), large (16 KiB - 1.2 MiB) and
// mixed (8 B - 1.2 MiB), 24 phases by default. One replacement in 8 hands the old block to
// the next thread, which adopts it into its own live set, so blocks die on threads other
// than the one that made them. Then every block is freed, the threads end and the program
// sleeps (2 s).
//
// Measured: RSS over live bytes, where live bytes are the requested sizes of the blocks held
// plus the resident part of the workload's own index of them (16 B a block, outside malloc).
// A sample is taken every 100 ms and at each phase's end; with --timeline FILE each one is a
// JSON line there (live bytes also split into "requested" and "index", so that the size
// classes' rounding can be told apart), with traymalloc's own numbers (per class live and
// reserved bytes) when tray_stats_get is present (looked up with dlsym, so the program runs
// under any malloc).
// The RESULT line adds: rss_live_2nd_half (mean RSS over mean live, samples of the second half
// of the phases), worst_phase (the highest RSS / live of a phase's samples) and its index,
// rss_before_kb (before the first block), rss_idle_kb (after the idle time) and their
// difference idle_delta_kb.
//
// Options beyond the common ones: --live-mib N, --phases N, --turnover X (live sets
// allocated per thread per phase, times --scale), --idle-ms N, --minutes N (keep cycling the
// bands until N minutes have passed; --phases is then the minimum), --timeline FILE.
// Check: every block is stamped on every 4 KiB page and verified before it is freed.
// Ops: one replacement.
#include <sys/mman.h>
#include <unistd.h>

#include <barrier>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "traymalloc.h"

namespace {

struct Band {
  const char* name;
  size_t min_bytes;
  size_t max_bytes;
};
constexpr Band kBands[] = {
    {"small", 8, 256},
    {"medium", 256, 16 << 10},
    {"large", 16 << 10, 1200 << 10},
    {"mixed", 8, 1200 << 10},
};
constexpr unsigned kHandOffEvery = 8;
constexpr size_t kInboxBlocks = 4096;
constexpr auto kSampleEvery = std::chrono::milliseconds(100);

struct Settings {
  size_t live_bytes = size_t{48} << 20;
  unsigned phases = 24;
  double turnover = 2.0;
  unsigned idle_ms = 2000;
  double minutes = 0;
  std::string timeline;
};

struct Slot {
  void* ptr;
  size_t bytes;
};

uint64_t tag_of(const Slot& slot) {
  return workload::block_tag(slot.bytes, reinterpret_cast<uintptr_t>(slot.ptr));
}

size_t resident_bytes() {
  long pages[2] = {0, 0};
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  if (std::fscanf(statm, "%ld %ld", &pages[0], &pages[1]) != 2) pages[1] = 0;
  std::fclose(statm);
  return size_t(pages[1]) * size_t(sysconf(_SC_PAGESIZE));
}

// An array outside malloc (so its memory is the workload's, not the allocator's) whose unused
// tail can be given back, so that its resident size follows what it holds.
template <typename T>
class MappedArray {
 public:
  explicit MappedArray(size_t capacity) : capacity_(capacity) {
    void* p = mmap(nullptr, capacity * sizeof(T), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    items_ = static_cast<T*>(p);
  }
  ~MappedArray() { munmap(items_, capacity_ * sizeof(T)); }
  T& operator[](size_t i) { return items_[i]; }
  size_t capacity() const { return capacity_; }
  // Gives back the whole pages past the first `used` items.
  void trim(size_t used) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t keep = (used * sizeof(T) + page - 1) / page * page;
    if (keep < capacity_ * sizeof(T))
      madvise(reinterpret_cast<char*>(items_) + keep, capacity_ * sizeof(T) - keep, MADV_DONTNEED);
  }

 private:
  size_t capacity_;
  T* items_;
};

std::atomic<int64_t> g_live_bytes{0};   // requested bytes of every block held or in transit
std::atomic<int64_t> g_index_bytes{0};  // resident bytes of the workers' indexes (high-water)

class Worker {
 public:
  Worker(unsigned id, size_t target_bytes, workload::CheckCounter& checks)
      : target_(target_bytes), checks_(checks), slots_(target_bytes / 8 + kInboxBlocks),
        inbox_(kInboxBlocks), rng_(7000 + id) {}

  void set_neighbour(Worker* next) { neighbour_ = next; }

  // Allocates until `budget` bytes were asked for in this band, keeping the set at its target.
  uint64_t run_phase(const Band& band, double budget) {
    uint64_t steps = 0;
    for (double asked = 0; asked < budget; ++steps) {
      adopt_incoming();
      const size_t bytes = rng_.log_between(band.min_bytes, band.max_bytes);
      while (count_ > 0 && held_ + bytes > target_) drop(rng_.below(count_));
      add(Slot{std::malloc(bytes), bytes});
      asked += double(bytes);
    }
    return steps;
  }

  // Gives the index's unused pages back at a phase's end, so it counts only what it holds.
  void trim_index() {
    slots_.trim(count_);
    set_index_high_water(count_);
  }

  void free_everything() {
    adopt_incoming();
    while (count_ > 0) release(remove_at(count_ - 1));
    trim_index();
  }

 private:
  void add(Slot slot) {
    workload::stamp(slot.ptr, slot.bytes, tag_of(slot));
    g_live_bytes.fetch_add(int64_t(slot.bytes), std::memory_order_relaxed);
    place(slot);
  }

  void place(Slot slot) {
    slots_[count_++] = slot;
    held_ += slot.bytes;
    if (count_ > high_water_) set_index_high_water(count_);
  }

  void set_index_high_water(size_t count) {
    g_index_bytes.fetch_add(int64_t(count * sizeof(Slot)) - int64_t(high_water_ * sizeof(Slot)),
                            std::memory_order_relaxed);
    high_water_ = count;
  }

  Slot remove_at(size_t i) {
    const Slot slot = slots_[i];
    slots_[i] = slots_[--count_];
    held_ -= slot.bytes;
    return slot;
  }

  void release(const Slot& slot) {
    checks_.expect(workload::stamp_intact(slot.ptr, slot.bytes, tag_of(slot)), "soak block stamp");
    g_live_bytes.fetch_sub(int64_t(slot.bytes), std::memory_order_relaxed);
    std::free(slot.ptr);
  }

  // The victim dies here, or (one time in kHandOffEvery) lives on in the next thread.
  void drop(size_t i) {
    const Slot slot = remove_at(i);
    if (neighbour_ != this && ++drops_ % kHandOffEvery == 0 && neighbour_->offer(slot)) return;
    release(slot);
  }

  bool offer(Slot slot) {
    std::lock_guard lock(inbox_lock_);
    if (inbox_count_ == inbox_.capacity()) return false;
    inbox_[inbox_count_++] = slot;
    pending_.store(true, std::memory_order_relaxed);
    return true;
  }

  void adopt_incoming() {
    if (!pending_.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(inbox_lock_);
    for (size_t i = 0; i < inbox_count_; ++i) {
      const Slot slot = inbox_[i];
      while (count_ > 0 && held_ + slot.bytes > target_) release(remove_at(rng_.below(count_)));
      place(slot);
    }
    inbox_count_ = 0;
    pending_.store(false, std::memory_order_relaxed);
  }

  size_t target_;
  workload::CheckCounter& checks_;
  MappedArray<Slot> slots_;
  size_t count_ = 0;
  size_t held_ = 0;
  size_t high_water_ = 0;
  uint64_t drops_ = 0;
  Worker* neighbour_ = nullptr;
  std::mutex inbox_lock_;
  MappedArray<Slot> inbox_;
  size_t inbox_count_ = 0;
  std::atomic<bool> pending_{false};
  workload::Rng rng_;
};

using StatsGet = int (*)(tray_stats*);

// Samples go to the timeline file and into per-phase summaries.
class Recorder {
 public:
  explicit Recorder(const std::string& path) {
    if (!path.empty()) {
      out_ = std::fopen(path.c_str(), "w");
      if (out_ == nullptr) std::fprintf(stderr, "soak: cannot write %s\n", path.c_str());
    }
    stats_get_ = reinterpret_cast<StatsGet>(dlsym(RTLD_DEFAULT, "tray_stats_get"));
  }
  ~Recorder() {
    if (out_ != nullptr) std::fclose(out_);
  }

  void sample(const char* event, int phase, const char* band) {
    std::lock_guard lock(lock_);
    const double t = clock_.seconds();
    const size_t rss = resident_bytes();
    const int64_t requested = g_live_bytes.load(std::memory_order_relaxed);
    const int64_t index = g_index_bytes.load(std::memory_order_relaxed);
    const int64_t live = requested + index;
    if (phase >= 0 && live > 0) {
      if (size_t(phase) >= phases_.size()) phases_.resize(size_t(phase) + 1);
      PhaseSummary& summary = phases_[size_t(phase)];
      summary.worst = std::max(summary.worst, double(rss) / double(live));
      summary.rss += double(rss);
      summary.live += double(live);
    }
    if (out_ == nullptr) return;
    std::fprintf(out_, "{\"t\":%.3f,\"event\":\"%s\",\"phase\":%d,\"band\":\"%s\",\"rss\":%zu,"
                       "\"live\":%lld,\"requested\":%lld,\"index\":%lld",
                 t, event, phase, band, rss, static_cast<long long>(live),
                 static_cast<long long>(requested), static_cast<long long>(index));
    if (stats_get_ != nullptr) write_tray_stats();
    std::fputs("}\n", out_);
    std::fflush(out_);
  }

  double worst_phase(unsigned* index) const {
    double worst = 0;
    for (unsigned i = 0; i < phases_.size(); ++i)
      if (phases_[i].worst > worst) worst = phases_[i].worst, *index = i;
    return worst;
  }
  // Mean RSS over mean live bytes, over the samples of the second half of the phases.
  double second_half() const {
    double rss = 0, live = 0;
    for (size_t i = phases_.size() / 2; i < phases_.size(); ++i)
      rss += phases_[i].rss, live += phases_[i].live;
    return live > 0 ? rss / live : 0;
  }

 private:
  // traymalloc's own view: committed memory, the large cache, and per class the bytes of live
  // blocks and of the pages that hold them ([block_bytes, live_bytes, reserved_bytes]).
  void write_tray_stats() {
    tray_stats stats{};
    stats.version = TRAY_STATS_VERSION;
    if (stats_get_(&stats) != 0) return;
    std::fprintf(out_, ",\"tray\":{\"committed\":%llu,\"large_live\":%llu,\"large_cached\":%llu,"
                       "\"classes\":[",
                 stats.committed_bytes, stats.large.live_bytes, stats.large.cached_bytes);
    bool first = true;
    for (unsigned c = 0; c < stats.class_count; ++c) {
      const tray_class_stats& entry = stats.classes[c];
      if (entry.pages == 0) continue;
      std::fprintf(out_, "%s[%llu,%llu,%llu]", first ? "" : ",", entry.block_bytes,
                   entry.live_blocks * entry.block_bytes, entry.pages * entry.page_bytes);
      first = false;
    }
    std::fputs("]}", out_);
  }

  struct PhaseSummary {
    double worst = 0;  // highest RSS / live of a sample
    double rss = 0;    // sums over the samples
    double live = 0;
  };

  std::mutex lock_;
  std::FILE* out_ = nullptr;
  StatsGet stats_get_ = nullptr;
  workload::Stopwatch clock_;
  std::vector<PhaseSummary> phases_;
};

// Takes the soak's own options out of argv, leaving the common ones for parse_options.
Settings take_settings(int& argc, char** argv) {
  Settings settings;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const bool has_value = i + 1 < argc;
    bool valid = true;
    if (flag == "--describe" && argc == 2) {
      std::printf("DESCRIBE workload=soak threads=yes default_threads=2 timeline=yes\n");
      std::exit(0);
    } else if (flag == "--live-mib" && has_value) {
      size_t mib = 0;
      valid = workload::parse_number(argv[++i], mib) && mib > 0;
      settings.live_bytes = mib << 20;
    } else if (flag == "--phases" && has_value) {
      valid = workload::parse_number(argv[++i], settings.phases) && settings.phases > 0;
    } else if (flag == "--turnover" && has_value) {
      valid = workload::parse_number(argv[++i], settings.turnover) && settings.turnover > 0;
    } else if (flag == "--idle-ms" && has_value) {
      valid = workload::parse_number(argv[++i], settings.idle_ms);
    } else if (flag == "--minutes" && has_value) {
      valid = workload::parse_number(argv[++i], settings.minutes) && settings.minutes >= 0;
    } else if (flag == "--timeline" && has_value) {
      settings.timeline = argv[++i];
    } else {
      argv[kept++] = argv[i];
      continue;
    }
    if (!valid) {
      std::fprintf(stderr, "soak: bad value for %s\n", argv[i - 1]);
      std::exit(2);
    }
  }
  argc = kept;
  return settings;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings = take_settings(argc, argv);
  const workload::Options options = workload::parse_options(argc, argv, {"soak", 2});
  const unsigned threads = options.threads;
  const double budget = double(settings.live_bytes) / threads * settings.turnover * options.scale;

  workload::CheckCounter checks;
  std::vector<std::unique_ptr<Worker>> workers;
  for (unsigned i = 0; i < threads; ++i)
    workers.push_back(std::make_unique<Worker>(i, settings.live_bytes / threads, checks));
  for (unsigned i = 0; i < threads; ++i) workers[i]->set_neighbour(workers[(i + 1) % threads].get());

  Recorder recorder(settings.timeline);
  const size_t rss_before = resident_bytes();
  recorder.sample("start", -1, "");

  const workload::Stopwatch stopwatch;
  std::atomic<int> phase{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> ops{0};
  auto band_of = [](int index) { return kBands[size_t(index) % std::size(kBands)]; };
  // Runs on the last thread to reach the barrier, the others waiting: a quiet moment.
  auto phase_end = [&]() noexcept {
    const int ended = phase.load();
    for (auto& worker : workers) worker->trim_index();
    recorder.sample("phase_end", ended, band_of(ended).name);
    const bool more_time = settings.minutes > 0 && stopwatch.seconds() < settings.minutes * 60;
    if (unsigned(ended + 1) >= settings.phases && !more_time) done.store(true);
    else phase.store(ended + 1);
  };
  std::barrier sync(std::ptrdiff_t(threads), phase_end);
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      while (!done.load()) {
        ops.fetch_add(workers[i]->run_phase(band_of(phase.load()), budget),
                      std::memory_order_relaxed);
        sync.arrive_and_wait();
      }
      // Every thread is past its last phase: nothing is handed over any more.
      workers[i]->free_everything();
    });
  }
  // Samples while the threads run; the barrier's completion adds one at each phase's end.
  while (!done.load()) {
    std::this_thread::sleep_for(kSampleEvery);
    const int current = phase.load();
    if (!done.load()) recorder.sample("tick", current, band_of(current).name);
  }
  // The threads free everything and end, as a program's workers do when its work is done
  // (an allocator cannot take back blocks that a thread which sleeps on has not yet taken in
  // from other threads); then the idle time.
  for (std::thread& t : pool) t.join();
  const double seconds = stopwatch.seconds();
  recorder.sample("freed", -1, "");
  const workload::Stopwatch idle;
  while (idle.seconds() * 1000 < settings.idle_ms) {
    std::this_thread::sleep_for(kSampleEvery);
    recorder.sample("idle", -1, "");
  }
  const size_t rss_idle = resident_bytes();

  unsigned worst_index = 0;
  const double worst = recorder.worst_phase(&worst_index);
  char extra[256];
  std::snprintf(extra, sizeof extra,
                " live_kb=%zu rss_live_2nd_half=%.3f worst_phase=%.3f worst_phase_index=%u"
                " rss_before_kb=%zu rss_idle_kb=%zu idle_delta_kb=%lld",
                settings.live_bytes >> 10, recorder.second_half(), worst, worst_index,
                rss_before >> 10, rss_idle >> 10,
                static_cast<long long>(rss_idle >> 10) - static_cast<long long>(rss_before >> 10));
  return workload::report("soak", threads, ops.load(), seconds, checks, extra);
}
