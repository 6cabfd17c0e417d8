// Tunables of the size classes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// Classes up to this size are pooled; larger requests are large blocks (span blocks or
// mappings of their own, large/).
inline constexpr size_t kMaxSmallBytes = size_t{128} << 10;          // 128 KiB

}  // namespace tray
