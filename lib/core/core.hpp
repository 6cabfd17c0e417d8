// The core: what every layer builds on and that needs nothing of the OS or of any subsystem:
// the geometry of the address space, bit tricks and compiler hints, bitmaps, a peak over a
// sliding window, and text formatting into a caller's buffer.
#pragma once

#include "core/bitmap.hpp"
#include "core/bits.hpp"
#include "core/format.hpp"
#include "core/geometry.hpp"
#include "core/recent_peak.hpp"
