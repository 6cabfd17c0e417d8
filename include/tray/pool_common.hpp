// What tray::ObjectPool, tray::FrameArena and tray::PoolAllocator share: the debug switch,
// the destroyed-memory fill, fatal-error reporting and in-place construction. Header-only and
// independent of the allocator core.
#pragma once

#include <unistd.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

namespace tray {

// Written over destroyed pool slots and over arena memory dropped by reset() in debug mode,
// so that a stale pointer reads an unmistakable value instead of plausible old data.
inline constexpr uint32_t kDestroyedFill = 0x1deadb0b;

namespace pool_detail {

// The `debug` setting of a TRAY_OPTIONS string ("key=value,key=value"): the last `debug=1` or
// `debug=0` wins; nullopt when neither appears. Other keys belong to the allocator core.
constexpr std::optional<bool> debug_option(std::string_view options) {
  std::optional<bool> debug;
  while (!options.empty()) {
    const size_t comma = options.find(',');
    const std::string_view item = options.substr(0, comma);
    options = comma == std::string_view::npos ? std::string_view{} : options.substr(comma + 1);
    if (item == "debug=1") debug = true;
    if (item == "debug=0") debug = false;
  }
  return debug;
}

#ifdef NDEBUG
inline constexpr bool kDebugBuild = false;
#else
inline constexpr bool kDebugBuild = true;
#endif

// Repeats kDestroyedFill over [at, at + bytes); the pattern's phase follows `at`'s offset from
// a 4-byte boundary of the caller's choosing, so callers start on such a boundary.
inline void fill_destroyed(std::byte* at, size_t bytes) noexcept {
  unsigned char pattern[sizeof kDestroyedFill];
  std::memcpy(pattern, &kDestroyedFill, sizeof pattern);
  for (size_t i = 0; i < bytes; ++i) at[i] = std::byte{pattern[i % sizeof pattern]};
}

inline bool holds_destroyed_fill(const std::byte* at, size_t bytes) noexcept {
  unsigned char pattern[sizeof kDestroyedFill];
  std::memcpy(pattern, &kDestroyedFill, sizeof pattern);
  for (size_t i = 0; i < bytes; ++i) {
    if (at[i] != std::byte{pattern[i % sizeof pattern]}) return false;
  }
  return true;
}

// Constructs a T at `at`. Aggregates without a matching constructor get braces: parenthesized
// aggregate initialization (C++20) is missing from clang before 16.
template <class T, class... Args>
T* construct_at(void* at, Args&&... args) {
  if constexpr (std::is_constructible_v<T, Args...>) {
    return ::new (at) T(std::forward<Args>(args)...);
  } else {
    return ::new (at) T{std::forward<Args>(args)...};
  }
}

// Builds a one-line message in a fixed buffer and stops the process. No allocation and no
// stdio: the heap may be what is corrupt, and stdio buffers could be lost by abort().
class FatalMessage {
 public:
  FatalMessage& operator<<(std::string_view text) noexcept {
    const size_t n = text.size() < room() ? text.size() : room();
    if (n == 0) return *this;  // an empty view may have a null data()
    std::memcpy(buffer_ + length_, text.data(), n);
    length_ += n;
    return *this;
  }
  // Without this, string literals would pick the address overload below.
  FatalMessage& operator<<(const char* text) noexcept { return *this << std::string_view(text); }
  FatalMessage& operator<<(size_t number) noexcept {
    length_ = size_t(std::to_chars(buffer_ + length_, buffer_ + kCapacity, number).ptr - buffer_);
    return *this;
  }
  FatalMessage& operator<<(const void* address) noexcept {
    *this << "0x";
    length_ = size_t(std::to_chars(buffer_ + length_, buffer_ + kCapacity,
                                   reinterpret_cast<uintptr_t>(address), 16).ptr -
                     buffer_);
    return *this;
  }
  [[noreturn]] void abort_process() noexcept {
    *this << "\n";
    // Nothing useful can be done if stderr is gone; the abort still happens.
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, buffer_, length_);
    std::abort();
  }

 private:
  static constexpr size_t kCapacity = 256;
  size_t room() const noexcept { return kCapacity - length_; }

  char buffer_[kCapacity];
  size_t length_ = 0;
};

}  // namespace pool_detail

// Whether pools and arenas run their debug checks: TRAY_OPTIONS (the variable the allocator
// reads too) decides when it says debug=1 or debug=0; otherwise builds without NDEBUG are in
// debug mode. Read once per process; each pool and arena samples it when constructed.
inline bool pool_debug_enabled() noexcept {
  static const bool enabled = [] {
    const char* options = std::getenv("TRAY_OPTIONS");
    return pool_detail::debug_option(options ? options : "").value_or(pool_detail::kDebugBuild);
  }();
  return enabled;
}

}  // namespace tray
