// The most a quantity reached lately: what a program held "a moment ago". The large cache and
// the span chunks keep what was freed since then warm, since it was resident at that moment
// anyway. Not thread-safe: each owner updates and reads it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tray {

template <uint64_t kWindowMs>
class RecentPeak {
 public:
  // Takes `value` in if it is a new high, or if the high is a window old (the high then
  // starts again from the value of the moment).
  void note(size_t value, uint64_t now_ms) {
    if (value >= bytes_ || now_ms >= since_ms_ + kWindowMs) {
      bytes_ = value;
      since_ms_ = now_ms;
    }
  }
  // The high as noted last, however old.
  size_t bytes() const { return bytes_; }
  // The high if it is less than a window old, else 0.
  size_t recent(uint64_t now_ms) const { return now_ms < until_ms() ? bytes_ : 0; }
  // When the high stops counting as recent, unless a new one comes first.
  uint64_t until_ms() const { return since_ms_ + kWindowMs; }

 private:
  size_t bytes_ = 0;
  uint64_t since_ms_ = 0;
};

}  // namespace tray
