// Stacks for the heap profile at a small share of libgcc's cost. glibc's backtrace() asks
// libgcc's unwinder, which for every frame finds the function's call-frame information (the
// .eh_frame section that C and C++ compilers emit for exceptions), parses its CIE and FDE and
// runs their DWARF program up to the return address: some 2,000 instructions a frame, paid
// again by every sample. Here the outcome of that work for one return address, which is all a
// walk needs on x86-64 (where the frame's CFA is, which register it hangs from, and where the
// caller's rbp was saved), is decoded from the same call-frame information once and kept in a
// lock-free cache keyed by the return address; a walk then costs a lookup and two loads a frame.
//
// Frames the cache cannot describe (signal frames, DWARF expressions, code without call-frame
// information) make the walk give up, and the caller asks libgcc for the whole stack: the
// stacks are the ones backtrace() gives, to the frame.
#pragma once

namespace tray::os {

// The calling thread's return addresses, innermost first, the first in the caller: what
// backtrace() would store if called in this call's place. -1 when a frame needs libgcc.
// Never allocates; takes the loader's lock for a moment (to see objects unloaded).
int unwind_stack(void** frames, int capacity);

}  // namespace tray::os
