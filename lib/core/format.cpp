#include "core/format.hpp"


namespace tray {

TextBuffer& TextBuffer::chr(char c) {
  if (length_ < capacity_) data_[length_++] = c;
  return *this;
}

TextBuffer& TextBuffer::str(const char* s) {
  while (*s != '\0') chr(*s++);
  return *this;
}

TextBuffer& TextBuffer::count(uint64_t value, const char* one, const char* many) {
  return dec(value).chr(' ').str(value == 1 ? one : many);
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

TextBuffer& TextBuffer::human(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return dec(bytes).str(" B");
  unsigned unit = 0;
  uint64_t scale = 1024;
  while (unit < 3 && bytes / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  return ratio(bytes, scale, 1).chr(' ').str(kUnits[unit]);
}

TextBuffer& TextBuffer::ratio(uint64_t numerator, uint64_t denominator, unsigned digits) {
  if (denominator == 0) numerator = 0, denominator = 1;
  // Keep rest * 10 (rest < denominator) inside 64 bits; the digits shown do not change.
  while (denominator > (uint64_t{1} << 59)) numerator >>= 1, denominator >>= 1;
  dec(numerator / denominator);
  if (digits == 0) return *this;
  chr('.');
  // Long division, digit by digit, so that no intermediate product can overflow.
  uint64_t rest = numerator % denominator;
  for (unsigned i = 0; i < digits; ++i) {
    const uint64_t scaled = rest * 10;
    chr(char('0' + scaled / denominator));
    rest = scaled % denominator;
  }
  return *this;
}

TextBuffer& TextBuffer::align_right(size_t start, size_t width) {
  const size_t cell = length_ - start;
  if (cell >= width || length_ + (width - cell) > capacity_) return *this;
  const size_t shift = width - cell;
  for (size_t i = length_; i > start; --i) data_[i - 1 + shift] = data_[i - 1];
  for (size_t i = 0; i < shift; ++i) data_[start + i] = ' ';
  length_ += shift;
  return *this;
}


}  // namespace tray
