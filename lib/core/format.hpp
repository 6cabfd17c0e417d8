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
  TextBuffer& hex(uint64_t value, unsigned min_digits = 1);  // lower-case, no prefix
  TextBuffer& ptr(const void* p);                            // 0x-prefixed
  TextBuffer& size(uint64_t bytes);                          // "64 B", "12 KiB", "3 MiB"

  const char* data() const { return data_; }
  size_t length() const { return length_; }
  void write_to(int fd) const;

 private:
  char* data_;
  size_t capacity_;
  size_t length_ = 0;
};

}  // namespace tray
