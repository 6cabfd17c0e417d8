// The platform layer: every call into the OS (memory, threads, locks, futexes, signals, time,
// files), backtraces and the symbol tables that name their frames, the fatal-error path that
// the checks of every layer end in, and the annotations that tell memcheck and ASan about
// memory ranges.
#pragma once

#include "platform/assert.hpp"
#include "platform/elf_symbols.hpp"
#include "platform/os.hpp"
#include "platform/track.hpp"
#include "platform/unwind.hpp"
