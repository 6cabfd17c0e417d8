// The memory limit in whole programs (tray_limit_probe, traymalloc linked in): memory_limit
// with the fail action, a cgroup's limit read from files under a test root (v1 and v2), and a
// real cgroup v1 memory controller where the test may make a group (as root).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct ProbeResult {
  int status = 0;  // waitpid's
  size_t live = 0, freed = 0, again = 0;
  int error = -1, intact = 0, bad_alloc = 0;
};

void write_file(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  fputs(text.c_str(), f);
  fclose(f);
}

void make_dirs(const std::string& path) {
  for (size_t at = 1; at != std::string::npos; at = path.find('/', at + 1))
    mkdir(path.substr(0, at).c_str(), 0755);
  mkdir(path.c_str(), 0755);
}

// Runs the probe with TRAY_OPTIONS=options (and TRAY_CGROUP_ROOT=root unless empty), in the
// cgroup whose cgroup.procs is `procs` unless empty.
ProbeResult run_probe(const std::string& options, const std::string& root, const std::string& procs,
                      const char* cap_mib = "512") {
  const char* probe = TRAY_LIMIT_PROBE;  // the build's (tests/stats/CMakeLists.txt)
  ProbeResult result;
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    if (!procs.empty()) {
      const std::string self = std::to_string(getpid());
      const int fd = open(procs.c_str(), O_WRONLY);
      if (fd < 0 || write(fd, self.data(), self.size()) != ssize_t(self.size())) _exit(90);
      close(fd);
    }
    dup2(pipe_fds[1], STDOUT_FILENO);
    close(pipe_fds[0]);
    setenv("TRAY_OPTIONS", options.c_str(), 1);
    if (root.empty()) unsetenv("TRAY_CGROUP_ROOT");
    else setenv("TRAY_CGROUP_ROOT", root.c_str(), 1);
    execl(probe, probe, cap_mib, static_cast<char*>(nullptr));
    _exit(91);
  }
  close(pipe_fds[1]);
  char text[256] = {};
  size_t length = 0;
  for (ssize_t n; (n = read(pipe_fds[0], text + length, sizeof text - 1 - length)) > 0;) length += size_t(n);
  close(pipe_fds[0]);
  waitpid(pid, &result.status, 0);
  sscanf(text, "live=%zu errno=%d freed=%zu again=%zu intact=%d bad_alloc=%d", &result.live, &result.error,
         &result.freed, &result.again, &result.intact, &result.bad_alloc);
  return result;
}

// What a program under a limit of `limit` MiB that fails allocations must see: NULL with
// ENOMEM once `low`..`limit` MiB are live, every block freed fits again, the survivors intact,
// and operator new throwing past the limit.
void expect_limited(const ProbeResult& r, size_t low_mib, size_t limit_mib) {
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)
      << "status " << r.status << (WIFSIGNALED(r.status) ? " (killed by a signal)" : "");
  EXPECT_EQ(r.error, ENOMEM);
  EXPECT_GE(r.live, low_mib * kMiB);
  EXPECT_LE(r.live, limit_mib * kMiB);
  EXPECT_EQ(r.again, r.freed);
  EXPECT_EQ(r.intact, 1);
  EXPECT_EQ(r.bad_alloc, 1);
}

class TempRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tray_cgroup_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { (void)!system(("rm -rf " + root_).c_str()); }
  std::string root_;
};

TEST(Limit, FailActionAt64MiB) {
  expect_limited(run_probe("memory_limit=64m,memory_limit_action=fail", "", ""), 48, 64);
}

// The same program without the limit runs to its own cap: what the test above sees is the
// limit's doing.
TEST(Limit, NoLimitNoNull) {
  const ProbeResult r = run_probe("memory_limit=0", "", "", "96");
  EXPECT_EQ(r.error, 0);
  EXPECT_GT(r.live, 96 * kMiB);
}

using CgroupFiles = TempRoot;

// cgroup v1, as Docker without a cgroup namespace shows it: the hierarchy's mount root is the
// container's own group. 128 MiB, less the margin.
TEST_F(CgroupFiles, V1LimitInBytes) {
  make_dirs(root_ + "/proc/self");
  write_file(root_ + "/proc/self/cgroup", "6:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc/job\n0::/\n");
  write_file(root_ + "/proc/self/mountinfo",
             "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
             "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n");
  make_dirs(root_ + "/sys/fs/cgroup/memory/job");
  write_file(root_ + "/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  write_file(root_ + "/sys/fs/cgroup/memory/job/memory.soft_limit_in_bytes", "9223372036854771712\n");
  write_file(root_ + "/sys/fs/cgroup/memory/memory.limit_in_bytes", "134217728\n");
  expect_limited(run_probe("memory_limit_action=fail", root_, ""), 96, 128);
}

// cgroup v2: memory.high below memory.max binds.
TEST_F(CgroupFiles, V2MemoryHigh) {
  make_dirs(root_ + "/proc/self");
  write_file(root_ + "/proc/self/cgroup", "0::/app.slice/job\n");
  write_file(root_ + "/proc/self/mountinfo", "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n");
  make_dirs(root_ + "/sys/fs/cgroup/app.slice/job");
  write_file(root_ + "/sys/fs/cgroup/app.slice/memory.max", "268435456\n");
  write_file(root_ + "/sys/fs/cgroup/app.slice/job/memory.max", "max\n");
  write_file(root_ + "/sys/fs/cgroup/app.slice/job/memory.high", "134217728\n");
  expect_limited(run_probe("memory_limit_action=fail", root_, ""), 96, 128);
  // memory_limit=0 turns the cgroup's limit off.
  const ProbeResult off = run_probe("memory_limit=0,memory_limit_action=fail", root_, "", "160");
  EXPECT_EQ(off.error, 0);
  EXPECT_GT(off.live, 160 * kMiB);
}

// A real memory cgroup of 128 MiB (v1, as Debian 12 mounts it for root): the program sees NULL
// and is not killed by the kernel.
TEST(Limit, RealCgroupV1) {
  const std::string base = "/sys/fs/cgroup/memory";
  struct stat info;
  if (geteuid() != 0 || stat((base + "/memory.limit_in_bytes").c_str(), &info) != 0)
    GTEST_SKIP() << "needs root and the cgroup v1 memory controller at " << base;
  const std::string group = base + "/traymalloc_limit_" + std::to_string(getpid());
  if (mkdir(group.c_str(), 0755) != 0) GTEST_SKIP() << "cannot make " << group << ": " << strerror(errno);
  write_file(group + "/memory.limit_in_bytes", "134217728");
  // Without swap accounting the kernel could page the probe out instead of holding it to the
  // limit; with it, the two limits together.
  if (stat((group + "/memory.memsw.limit_in_bytes").c_str(), &info) == 0)
    write_file(group + "/memory.memsw.limit_in_bytes", "134217728");
  const ProbeResult r = run_probe("memory_limit_action=fail", "", group + "/cgroup.procs");
  rmdir(group.c_str());
  expect_limited(r, 96, 128);
}

}  // namespace
