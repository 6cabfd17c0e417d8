// ruby_stress: a real interpreter under load. Runs the Ruby script ruby_stress.rb as a child:
// Ruby threads that build and drop hashes, arrays and strings of mixed sizes (some of 10..200 KB),
// join and split them, and keep a few alive for a while.
//
// Models a scripting-language program rather than a synthetic pattern: the allocation mix of a
// real interpreter, its garbage collector and its object heap, as the real programs that
// mimalloc-bench runs beside its synthetic tests do. The script is ours (see its header). Ruby
// threads share one interpreter lock, so they do not allocate in parallel, but their garbage
// collection and allocations still interleave; --threads sets the Ruby thread count anyway.
//
// How it runs: the driver finds ruby (the RUBY environment variable, else /usr/bin/ruby, else
// the first ruby on PATH), finds ruby_stress.rb next to its own binary (/proc/self/exe; the
// build copies it there), starts `ruby ruby_stress.rb THREADS ITERATIONS` with posix_spawn and
// the environment unchanged, so LD_PRELOAD reaches ruby, and waits for it with wait4. Without
// ruby it says so on stderr and exits 77 (the smoke test's skip code), and its --describe line
// says missing=ruby, so tools/bench-compare leaves it out.
//
// --expect-malloc is checked in the driver, the usual way: driver and child load the same
// LD_PRELOAD, so the malloc the driver finds is the one ruby gets (Debian's ruby uses the
// system malloc and links no allocator of its own).
//
// seconds: the child's wall time, from spawn to wait4 (ruby's start-up included).
// peak_rss_kb: the child's ru_maxrss from wait4, not the driver's VmHWM (which would be the
// driver's). Linux carries a maximum RSS over exec: the exec'ing process keeps the peak RSS of
// the memory image exec replaced, which is why the other workloads, started by bench-compare's
// Python, read their own VmHWM instead. Here the image ruby replaces is this small driver's
// (posix_spawn's child runs on the driver's memory until it execs ruby), a few MiB, well under
// ruby's own peak; what carried over into the driver from whatever started it is the driver's,
// not passed on. So ru_maxrss is ruby's peak. The script's own VmHWM comes as child_vmhwm_kb.
//
// Check: the child exits 0 and its last line is "ok CHECKSUM ..." (the script checks its own
// data: parsed structures against built ones, sums, kept strings; see ruby_stress.rb). The
// checksum depends only on threads and iterations and is reported, so runs can be compared.
// Ops: one script round (build, join, split, check, drop). Default: 2 threads, 250 rounds each.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common.hpp"

extern char** environ;

namespace {

constexpr uint64_t kIterationsPerThread = 250;
constexpr int kSkipExit = 77;

bool executable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0;
}

// RUBY, else /usr/bin/ruby, else the first ruby on PATH; empty if there is none (or RUBY names
// no executable file).
std::string find_ruby() {
  if (const char* given = std::getenv("RUBY"); given != nullptr && *given != '\0')
    return executable(given) ? given : std::string{};
  if (executable("/usr/bin/ruby")) return "/usr/bin/ruby";
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "";
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string_view folder = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    const std::string candidate = std::string(folder.empty() ? "." : folder) + "/ruby";
    if (executable(candidate)) return candidate;
  }
  return {};
}

// For --describe: tools/bench-compare skips the workload where there is no ruby.
const char* missing() { return find_ruby().empty() ? "ruby" : nullptr; }

std::string script_path() {
  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) return "ruby_stress.rb";
  std::string path(self, static_cast<size_t>(length));
  return path.substr(0, path.rfind('/') + 1) + "ruby_stress.rb";
}

// The value of " key=" in line, or "-1".
std::string field(const std::string& line, const char* key) {
  const size_t at = line.find(std::string(" ") + key + "=");
  if (at == std::string::npos) return "-1";
  const size_t start = at + std::strlen(key) + 2;
  return line.substr(start, line.find(' ', start) - start);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"ruby_stress", 2, missing});
  const unsigned threads = options.threads;
  const uint64_t iterations = options.scaled(kIterationsPerThread, 2);
  const std::string ruby = find_ruby();
  if (ruby.empty()) {
    std::fprintf(stderr,
                 "ruby_stress: no ruby found (RUBY names no executable file, or there is none: "
                 "apt-get install ruby); skipped\n");
    return kSkipExit;
  }
  const std::string script = script_path();
  if (access(script.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "ruby_stress: %s is missing (the build copies it next to the binary)\n",
                 script.c_str());
    return 1;
  }
  std::string ruby_arg = ruby, script_arg = script, thread_arg = std::to_string(threads),
              iteration_arg = std::to_string(iterations);
  char* child_argv[] = {ruby_arg.data(), script_arg.data(), thread_arg.data(), iteration_arg.data(),
                        nullptr};

  // The child's stdout comes back through a pipe; its stderr goes where ours goes.
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return std::perror("ruby_stress: pipe2"), 1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  const workload::Stopwatch stopwatch;
  pid_t child = 0;
  const int spawned = posix_spawn(&child, ruby.c_str(), &actions, nullptr, child_argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    std::fprintf(stderr, "ruby_stress: cannot start %s: %s\n", ruby.c_str(),
                 std::strerror(spawned));
    return 1;
  }
  std::string output;
  char buffer[4096];
  for (;;) {
    const ssize_t got = read(out[0], buffer, sizeof buffer);
    if (got > 0) {
      output.append(buffer, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      break;
    }
  }
  close(out[0]);
  int status = 0;
  struct rusage usage {};
  while (wait4(child, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  const double seconds = stopwatch.seconds();

  while (!output.empty() && output.back() == '\n') output.pop_back();
  const size_t last_break = output.rfind('\n');
  const std::string last_line =
      last_break == std::string::npos ? output : output.substr(last_break + 1);
  const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const bool said_ok = last_line.rfind("ok ", 0) == 0;
  workload::CheckCounter checks;
  checks.expect(exited_ok, "ruby_stress: ruby did not exit with status 0");
  checks.expect(said_ok, "ruby_stress: ruby did not print \"ok CHECKSUM\"");
  if (!exited_ok)
    std::fprintf(stderr, "ruby_stress: ruby %s %d\n",
                 WIFSIGNALED(status) ? "killed by signal" : "exit",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  if (!said_ok)
    std::fprintf(stderr, "ruby_stress: ruby's output ended with: %s\n", last_line.c_str());
  const std::string checksum = said_ok ? last_line.substr(3, last_line.find(' ', 3) - 3) : "none";

  return workload::report_with_rss(
      "ruby_stress", threads, uint64_t{threads} * iterations, seconds, usage.ru_maxrss, checks,
      " ruby_checksum=" + checksum + " child_vmhwm_kb=" + field(last_line, "vmhwm_kb"));
}
