// Tunables of the size classes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// Classes up to this size are pooled; larger requests are large blocks (span blocks or
// mappings of their own, large/).
inline constexpr size_t kMaxSmallBytes = size_t{2} << 20;            // 2 MiB
// Classes above this size are big classes: blocks of many OS pages, whose pages hold fewer
// blocks, and whose free blocks give back their OS pages past the first while they stay on
// their page's free list (heap/sparse.cpp).
inline constexpr size_t kBigClassThresholdBytes = size_t{128} << 10; // 128 KiB

}  // namespace tray
