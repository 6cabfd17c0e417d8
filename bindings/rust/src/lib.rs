//! traymalloc for Rust: the allocator as the program's global allocator, heaps that are
//! emptied in one call, and the allocator's statistics.
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: traymalloc::TrayMalloc = traymalloc::TrayMalloc;
//!
//! fn main() {
//!     let v: Vec<u64> = (0..1000).collect(); // a traymalloc block
//!     assert!(traymalloc::owns(v.as_ptr() as *const u8));
//!     traymalloc::dump_stats();
//! }
//! ```
//!
//! The crate calls the prefixed C API (`tray_malloc`, ...), so by default the C library's
//! `malloc` stays what it was for C code linked into the program; only Rust's allocations go
//! to traymalloc. Built with `TRAYMALLOC_SYSTEM=1` it links an installed `libtraymalloc.so`,
//! which replaces `malloc` for the whole process as well (README.md of this crate).

use std::alloc::{GlobalAlloc, Layout};
use std::os::raw::c_void;
use std::ptr;

pub mod ffi;
mod heap;
mod stats;

pub use heap::Heap;
pub use stats::{
    dump_stats, stats, write_stats, ClassStats, LargeStats, MemoryLimitStats, Stats, StatsFormat,
};

/// Every block traymalloc hands out is aligned to this, whatever its size (its smallest size
/// class is 16 bytes); a layout asking for more goes to the aligned entry points.
pub const NATURAL_ALIGNMENT: usize = 16;

/// Largest alignment traymalloc serves (512 MiB); a layout asking for more gets null.
pub const MAX_ALIGNMENT: usize = ffi::TRAY_MAX_ALIGNMENT;

/// traymalloc as a [`GlobalAlloc`]:
///
/// ```no_run
/// #[global_allocator]
/// static GLOBAL: traymalloc::TrayMalloc = traymalloc::TrayMalloc;
/// # fn main() {}
/// ```
///
/// Layouts aligned to at most [`NATURAL_ALIGNMENT`] go to `tray_malloc`, `tray_calloc` and
/// `tray_realloc`; larger alignments to `tray_aligned_alloc`. Frees pass the layout's size
/// (and alignment) on, as C23's `free_sized` and `free_aligned_sized`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrayMalloc;

unsafe impl GlobalAlloc for TrayMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= NATURAL_ALIGNMENT {
            ffi::tray_malloc(layout.size()) as *mut u8
        } else {
            ffi::tray_aligned_alloc(layout.align(), layout.size()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= NATURAL_ALIGNMENT {
            // calloc knows which blocks are fresh from the OS and skips zeroing those.
            ffi::tray_calloc(1, layout.size()) as *mut u8
        } else {
            let p = ffi::tray_aligned_alloc(layout.align(), layout.size()) as *mut u8;
            if !p.is_null() {
                ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.align() <= NATURAL_ALIGNMENT {
            ffi::tray_free_sized(ptr as *mut c_void, layout.size());
        } else {
            ffi::tray_free_aligned_sized(ptr as *mut c_void, layout.align(), layout.size());
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= NATURAL_ALIGNMENT {
            return ffi::tray_realloc(ptr as *mut c_void, new_size) as *mut u8;
        }
        // tray_realloc promises only the natural alignment for the block it moves to, and the
        // result must keep the layout's: move by hand. On failure the old block stays, as
        // GlobalAlloc::realloc requires.
        realloc_aligned(ptr, layout, new_size, |align, size| {
            ffi::tray_aligned_alloc(align, size) as *mut u8
        })
    }
}

/// Moves a block aligned above [`NATURAL_ALIGNMENT`] into one of `new_size` bytes that
/// `allocate` returns with the same alignment, then frees the old one.
pub(crate) unsafe fn realloc_aligned(
    ptr: *mut u8,
    layout: Layout,
    new_size: usize,
    allocate: impl FnOnce(usize, usize) -> *mut u8,
) -> *mut u8 {
    let new = allocate(layout.align(), new_size);
    if !new.is_null() {
        ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
        ffi::tray_free_aligned_sized(ptr as *mut c_void, layout.align(), layout.size());
    }
    new
}

/// Whether `ptr` lies in memory traymalloc manages (O(1), without touching `ptr`). It says
/// nothing about whether the block there is live.
pub fn owns(ptr: *const u8) -> bool {
    unsafe { ffi::tray_owns(ptr as *const c_void) != 0 }
}

/// Bytes usable at `ptr`, a block traymalloc handed out: at least what was asked for; 0 for
/// null or memory traymalloc does not manage.
///
/// # Safety
/// `ptr` must be null, outside traymalloc's memory, or a live block of it.
pub unsafe fn usable_size(ptr: *const u8) -> usize {
    ffi::tray_usable_size(ptr as *const c_void)
}

/// Gives every free page the process holds back to the OS now; true if any was.
pub fn trim() -> bool {
    unsafe { ffi::tray_trim() != 0 }
}
