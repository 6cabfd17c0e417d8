// The purger's signal: what lower layers call to hand the purger thread work (events.hpp).

#include "events/events.hpp"
#include "platform/platform.hpp"

namespace tray {

constinit std::atomic<PurgerState> g_purger_state{PurgerState::kNone};
constinit std::atomic<uint32_t> g_purger_wake{0};
constinit std::atomic<bool> g_purger_sleeping{false};
#if defined(TRAY_TSAN)
constinit std::atomic<uint32_t> g_purger_fence_word{0};
#endif
__thread unsigned tls_purger_holds = 0;
__thread bool tls_in_purger = false;

void purger_notify() {
  purger_fence();
  PurgerState state = g_purger_state.load(std::memory_order_relaxed);
  if (state == PurgerState::kNone) {
    g_purger_state.compare_exchange_strong(state, PurgerState::kWanted, std::memory_order_relaxed);
    return;
  }
  if (g_purger_sleeping.load(std::memory_order_relaxed) &&
      g_purger_sleeping.exchange(false, std::memory_order_relaxed)) {
    g_purger_wake.fetch_add(1, std::memory_order_relaxed);
    os::wake_all(g_purger_wake);
  }
}

void purger_require() {
  PurgerState state = PurgerState::kAwaitingThreads;
  g_purger_state.compare_exchange_strong(state, PurgerState::kWanted, std::memory_order_relaxed);
  purger_notify();
}

void purger_wake() {
  // Bumped after the caller published its work under a lock the pass takes: either the pass
  // already running sees the work, or its wait finds g_purger_wake changed and returns.
  g_purger_wake.fetch_add(1, std::memory_order_release);
  os::wake_all(g_purger_wake);
}

}  // namespace tray
