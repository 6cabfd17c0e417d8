// Text formatting into a caller's fixed buffer: the allocator's only way to build messages,
// because stdio may allocate. Output past the buffer is dropped, never overflowed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tray {

class TextBuffer {
 public:
  TextBuffer(char* storage, size_t capacity) : data_(storage), capacity_(capacity) {}

  TextBuffer& str(const char* s);
  TextBuffer& chr(char c);
  TextBuffer& dec(uint64_t value);
  TextBuffer& sdec(int64_t value);
  // "1 byte", "2 bytes": value, a space, and the noun that goes with it.
  TextBuffer& count(uint64_t value, const char* one, const char* many);
  TextBuffer& hex(uint64_t value, unsigned min_digits = 1);  // lower-case, no prefix
  TextBuffer& ptr(const void* p);                            // 0x-prefixed
  TextBuffer& size(uint64_t bytes);                          // "64 B", "12 KiB", "3 MiB"
  TextBuffer& human(uint64_t bytes);                         // "512 B", "1.5 KiB", "12.0 MiB"
  // numerator/denominator with `digits` decimals, rounded down ("0.934"); 0 if denominator is.
  TextBuffer& ratio(uint64_t numerator, uint64_t denominator, unsigned digits);
  // Right-aligns what was written since length `start` in a column of `width` characters.
  TextBuffer& align_right(size_t start, size_t width);

  const char* data() const { return data_; }
  size_t length() const { return length_; }
  void clear() { length_ = 0; }

 private:
  char* data_;
  size_t capacity_;
  size_t length_ = 0;
};

}  // namespace tray
