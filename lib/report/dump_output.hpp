// The writer of every dump format: text built in a buffer on the stack and handed to the sink
// whenever a piece is complete, so a dump of any length needs no allocation and a fixed stack.
#pragma once

#include <cstddef>

#include "core/core.hpp"
#include "report/stats_print.hpp"

namespace tray {

class DumpOutput {
 public:
  // The most that one piece, what a dump writes between two calls of piece_done, may hold.
  static constexpr size_t kPieceBytes = 768;

  explicit DumpOutput(StatsSink sink) : sink_(sink), text_(storage_, sizeof storage_) {}
  ~DumpOutput() { flush(); }
  DumpOutput(const DumpOutput&) = delete;
  DumpOutput& operator=(const DumpOutput&) = delete;
  TextBuffer& text() { return text_; }
  // Called between pieces: since no piece exceeds kPieceBytes, nothing is cut off.
  void piece_done() {
    if (text_.length() > sizeof storage_ - kPieceBytes) flush();
  }
  void flush() {
    if (text_.length() != 0) sink_.write(sink_.context, text_.data(), text_.length());
    text_.clear();
  }

 private:
  StatsSink sink_;
  char storage_[4096];
  TextBuffer text_;
};

}  // namespace tray
