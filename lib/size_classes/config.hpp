// Tunables of the size classes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// Classes up to this size are pooled; larger requests get a mapping of their own.
inline constexpr size_t kMaxSmallBytes = size_t{128} << 10;          // 128 KiB

}  // namespace tray
