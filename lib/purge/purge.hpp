// The purger thread: gives freed memory back to the OS when its delay runs out, whether or not
// the program calls the allocator again, and writes the periodic statistics dumps
// (stats_interval). Without it, dirty units and cached large blocks wait for the next trip to
// the page pool, which a program that has gone quiet never makes.
//
// Lower layers hand it work through its signal (events/events.hpp): whoever leaves something
// to purge (or sets stats_interval) marks it wanted, and the next allocation slow path that
// holds no lock and has its heap in order starts it (purger_poll), since creating a thread
// allocates. A large allocation marks it wanted at once, so that a program that frees its
// large blocks and goes quiet has it running. Option purge_thread=0 keeps it from starting.
// A forked child has no such thread; it is marked as wanted there and starts again the same
// way. Once started it stays while any thread of the program holds a heap, asleep without a
// deadline when nothing waits, so that frees (which cannot start it) always find it there.
#pragma once

#include "events/events.hpp"

namespace tray {

// Starts the thread if it is wanted (g_events.start_purger). `allowed` false (the entry's
// choice: debug mode runs none) turns it off until the next fork or purger_stop.
void purger_start(bool allowed);
// Ends the thread, if it runs, and waits until the kernel no longer counts it, for the calls
// that fail in a process with more than one thread (unshare and setns of user and mount
// namespaces): the program may not know it has a second one. True if it ended a thread. It
// starts again at the next allocation slow path, as after a fork.
bool purger_stop();
// In the child of a fork: the thread is not there.
void purger_after_fork_child();
// A thread took a heap: in a program that now has threads of its own, a purger that waited
// for them (PurgerState::kAwaitingThreads) is wanted.
void purger_after_thread_attached();

}  // namespace tray
