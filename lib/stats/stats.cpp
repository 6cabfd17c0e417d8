#include "stats/stats.hpp"

namespace tray {

constinit Totals g_totals;

}  // namespace tray
