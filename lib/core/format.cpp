#include "core/format.hpp"

#include "platform/os.hpp"

namespace tray {

TextBuffer& TextBuffer::chr(char c) {
  if (length_ < capacity_) data_[length_++] = c;
  return *this;
}

TextBuffer& TextBuffer::str(const char* s) {
  while (*s != '\0') chr(*s++);
  return *this;
}

TextBuffer& TextBuffer::dec(uint64_t value) {
  char digits[20];
  unsigned n = 0;
  do {
    digits[n++] = char('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (n > 0) chr(digits[--n]);
  return *this;
}

TextBuffer& TextBuffer::sdec(int64_t value) {
  if (value < 0) {
    chr('-');
    return dec(uint64_t(0) - uint64_t(value));
  }
  return dec(uint64_t(value));
}

TextBuffer& TextBuffer::hex(uint64_t value, unsigned min_digits) {
  char digits[16];
  unsigned n = 0;
  do {
    digits[n++] = "0123456789abcdef"[value & 15];
    value >>= 4;
  } while (value != 0);
  while (n < min_digits && n < 16) digits[n++] = '0';
  while (n > 0) chr(digits[--n]);
  return *this;
}

TextBuffer& TextBuffer::ptr(const void* p) {
  return str("0x").hex(reinterpret_cast<uintptr_t>(p));
}

TextBuffer& TextBuffer::size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  unsigned unit = 0;
  // Whole units only, and only when exact, so "40 B" and "48 KiB" read as what they are.
  while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return dec(bytes).chr(' ').str(kUnits[unit]);
}

void TextBuffer::write_to(int fd) const { os::write_fd(fd, data_, length_); }

}  // namespace tray
