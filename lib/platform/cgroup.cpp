// The memory limit of the process's cgroup (os.hpp), from the files the kernel keeps:
// /proc/self/cgroup names the process's cgroup in each hierarchy, /proc/self/mountinfo says
// where that hierarchy is mounted, and the cgroup's directory there (and each one above it,
// whose limits bind it too) holds the limits. Read at most once per process, at the first
// allocation that asks: with raw system calls into the caller's buffer, never allocating.
#include "core/core.hpp"
#include "platform/os.hpp"

namespace tray::os {

namespace {

constexpr size_t kPathBytes = 512;
// v1 writes "no limit" as 2^63 less a page, v2 as "max": anything this high is none.
constexpr uint64_t kUnlimited = uint64_t{1} << 60;
// The part of the caller's scratch that /proc/self/cgroup gets; mountinfo takes the rest.
constexpr size_t kCgroupFileBytes = 4096;

struct Text {
  const char* data;
  size_t length;
};

bool equals(Text text, const char* word) {
  size_t i = 0;
  for (; i < text.length; ++i)
    if (word[i] == '\0' || word[i] != text.data[i]) return false;
  return word[i] == '\0';
}

bool starts_with(Text text, Text prefix) {
  if (prefix.length > text.length) return false;
  for (size_t i = 0; i < prefix.length; ++i)
    if (text.data[i] != prefix.data[i]) return false;
  return true;
}

// The line of text[0, length) that starts at *at, which moves past it; false at the end.
bool next_line(const char* text, size_t length, size_t* at, Text* line) {
  if (*at >= length) return false;
  size_t end = *at;
  while (end < length && text[end] != '\n') ++end;
  *line = {text + *at, end - *at};
  *at = end + 1;
  return true;
}

// Field `index` (from 0) of `line` cut at `separator`; with `rest`, everything from there on
// (a cgroup path may hold the separator).
Text field(Text line, char separator, unsigned index, bool rest = false) {
  size_t start = 0;
  for (unsigned i = 0; i < index; ++i) {
    while (start < line.length && line.data[start] != separator) ++start;
    if (start == line.length) return {line.data + line.length, 0};
    ++start;
  }
  size_t end = start;
  while (!rest && end < line.length && line.data[end] != separator) ++end;
  return {line.data + start, (rest ? line.length : end) - start};
}

// Whether the comma-separated `list` holds `word`.
bool lists(Text list, const char* word) {
  for (unsigned i = 0;; ++i) {
    const Text item = field(list, ',', i);
    if (equals(item, word)) return true;
    if (item.data + item.length >= list.data + list.length) return false;
  }
}

// A mountinfo line's mount root (field 3), mount point (field 4), and, after the "-" that
// ends the optional fields, the file system type and its options.
struct Mount {
  Text root, point, type, options;
};

Mount parse_mount(Text line) {
  Mount mount{field(line, ' ', 3), field(line, ' ', 4), {}, {}};
  for (unsigned i = 6; i < 64; ++i) {
    const Text word = field(line, ' ', i);
    if (word.length == 0) break;
    if (equals(word, "-")) {
      mount.type = field(line, ' ', i + 1);
      mount.options = field(line, ' ', i + 3);
      break;
    }
  }
  return mount;
}

// The value of a limit file: bytes, or kUnlimited for "max", a missing file or anything else.
uint64_t read_limit(const char* path) {
  char text[64];
  const ssize_t length = read_small_file(path, text, sizeof text);
  if (length <= 0 || text[0] < '0' || text[0] > '9') return kUnlimited;
  uint64_t value = 0;
  for (ssize_t i = 0; i < length && text[i] >= '0' && text[i] <= '9'; ++i) {
    value = value * 10 + uint64_t(text[i] - '0');
    if (value >= kUnlimited) return kUnlimited;
  }
  return value;
}

// The lowest limit in `files` over the directory `dir` (of which the first `base` characters
// are the hierarchy's mount point) and each one above it up to the mount point.
uint64_t lowest_limit(char* dir, size_t length, size_t base, const char* const* files, char* source,
                      size_t source_capacity) {
  uint64_t lowest = kUnlimited;
  for (;;) {
    for (const char* const* file = files; *file != nullptr; ++file) {
      char path[kPathBytes + 64];
      TextBuffer text(path, sizeof path - 1);
      text.str(dir).chr('/').str(*file);
      path[text.length()] = '\0';
      const uint64_t value = read_limit(path);
      if (value >= lowest) continue;
      lowest = value;
      TextBuffer where(source, source_capacity - 1);
      where.str(path);
      source[where.length()] = '\0';
    }
    if (length <= base) return lowest;
    while (length > base && dir[length - 1] != '/') --length;
    if (length > base) --length;  // the '/' before the last name
    dir[length] = '\0';
  }
}

}  // namespace

size_t cgroup_memory_limit(const char* root, char* scratch, size_t scratch_bytes, char* source,
                           size_t source_capacity) {
  source[0] = '\0';
  if (scratch_bytes <= kCgroupFileBytes) return 0;
  char path[kPathBytes];
  TextBuffer name(path, sizeof path - 1);
  name.str(root).str("/proc/self/cgroup");
  path[name.length()] = '\0';
  const ssize_t cgroup_length = read_small_file(path, scratch, kCgroupFileBytes);
  if (cgroup_length <= 0) return 0;
  // A v1 memory controller line ("4:memory:/path") wins over the v2 one ("0::/path"): a
  // machine that mounts both keeps memory under v1.
  Text v1{}, v2{};
  size_t at = 0;
  Text line;
  while (next_line(scratch, size_t(cgroup_length), &at, &line)) {
    const Text controllers = field(line, ':', 1);
    if (controllers.length == 0 && equals(field(line, ':', 0), "0")) v2 = field(line, ':', 2, true);
    else if (lists(controllers, "memory")) v1 = field(line, ':', 2, true);
  }
  if (v1.length == 0 && v2.length == 0) return 0;
  const bool use_v1 = v1.length != 0;
  const Text cgroup = use_v1 ? v1 : v2;

  name.clear();
  name.str(root).str("/proc/self/mountinfo");
  path[name.length()] = '\0';
  char* mounts = scratch + kCgroupFileBytes;
  const ssize_t mounts_length = read_small_file(path, mounts, scratch_bytes - kCgroupFileBytes);
  if (mounts_length <= 0) return 0;
  at = 0;
  while (next_line(mounts, size_t(mounts_length), &at, &line)) {
    const Mount mount = parse_mount(line);
    const bool match = use_v1 ? equals(mount.type, "cgroup") && lists(mount.options, "memory")
                              : equals(mount.type, "cgroup2");
    if (!match) continue;
    // The cgroup's path is from the hierarchy's root; the mount shows the part below
    // mount.root (all of it, but inside a container that mounts only its own cgroup).
    Text below = cgroup;
    if (!equals(mount.root, "/") && starts_with(cgroup, mount.root))
      below = {cgroup.data + mount.root.length, cgroup.length - mount.root.length};
    char dir[kPathBytes];
    TextBuffer text(dir, sizeof dir - 1);
    text.str(root);
    for (size_t i = 0; i < mount.point.length; ++i) text.chr(mount.point.data[i]);
    const size_t base = text.length();
    for (size_t i = 0; i < below.length; ++i) text.chr(below.data[i]);
    size_t length = text.length();
    while (length > base && dir[length - 1] == '/') --length;
    if (length == sizeof dir - 1) return 0;  // cut short: not a path to trust
    dir[length] = '\0';
    static const char* const kV1Files[] = {"memory.limit_in_bytes", "memory.soft_limit_in_bytes", nullptr};
    static const char* const kV2Files[] = {"memory.max", "memory.high", nullptr};
    const uint64_t limit = lowest_limit(dir, length, base, use_v1 ? kV1Files : kV2Files, source, source_capacity);
    if (limit < kUnlimited) return size_t(limit);
    source[0] = '\0';
    return 0;
  }
  return 0;
}

}  // namespace tray::os
