//! The whole C API of `include/traymalloc.h`, declared as there, for what the safe wrappers do
//! not cover (options, heap profiles, a heap as a thread's default). Every function is `unsafe`
//! to call; the header's comments and docs/GUIDE.md ("API", "Heaps") give the contracts.

#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// Largest alignment the aligned functions accept (`TRAY_MAX_ALIGNMENT`).
pub const TRAY_MAX_ALIGNMENT: usize = 1 << 29;
/// The newest `tray_stats` layout these declarations describe.
pub const TRAY_STATS_VERSION: c_uint = 5;
pub const TRAY_STATS_MAX_CLASSES: usize = 64;
pub const TRAY_STATS_TEXT: c_uint = 0;
pub const TRAY_STATS_JSON: c_uint = 1;

/// `tray_heap_t`: opaque.
#[repr(C)]
pub struct tray_heap_t {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct tray_class_stats {
    pub block_bytes: c_ulonglong,
    pub page_bytes: c_ulonglong,
    pub blocks_per_page: c_ulonglong,
    pub live_blocks: c_ulonglong,
    pub peak_live_blocks: c_ulonglong,
    pub allocations: c_ulonglong,
    pub frees: c_ulonglong,
    pub pages: c_ulonglong,
    pub peak_pages: c_ulonglong,
    pub requested_bytes: c_ulonglong,
}

/// The anonymous `large` member of `tray_stats`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct tray_large_stats {
    pub allocations: c_ulonglong,
    pub frees: c_ulonglong,
    pub live_blocks: c_ulonglong,
    pub live_bytes: c_ulonglong,
    pub peak_bytes: c_ulonglong,
    pub mapped_bytes: c_ulonglong,
    pub cached_blocks: c_ulonglong,
    pub cached_bytes: c_ulonglong,
}

/// Version 3 of the layout; a library that knows only an older version fills the fields up to
/// where that version ends (see `tray_stats_get`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct tray_stats {
    pub version: c_uint,
    pub class_count: c_uint,
    pub classes: [tray_class_stats; TRAY_STATS_MAX_CLASSES],
    pub large: tray_large_stats,
    pub mapped_bytes: c_ulonglong,
    pub committed_bytes: c_ulonglong,
    pub resident_bytes: c_ulonglong,
    pub released_bytes: c_ulonglong,
    pub metadata_bytes: c_ulonglong,
    pub segments: c_ulonglong,
    pub threads_alive: c_ulonglong,
    pub threads_exited: c_ulonglong,
    pub heaps_created: c_ulonglong,
    pub remote_frees: c_ulonglong,
    pub foreign_frees: c_ulonglong,
    pub debug_errors: c_ulonglong,
    pub os_mmap: c_ulonglong,
    pub os_munmap: c_ulonglong,
    pub os_madvise: c_ulonglong,
    pub os_mremap: c_ulonglong,
    pub os_mprotect: c_ulonglong,
    /// Since version 2.
    pub unit_map_bytes: c_ulonglong,
    /// Since version 3.
    pub memory_limit_bytes: c_ulonglong,
    pub memory_limit_from_cgroup: c_ulonglong,
    pub memory_limit_fail: c_ulonglong,
    pub memory_limit_reached: c_ulonglong,
    pub memory_limit_failures: c_ulonglong,
    pub memory_limit_released_bytes: c_ulonglong,
    /// Since version 5.
    pub reused_blocks: c_ulonglong,
}

pub type tray_write_fn = Option<unsafe extern "C" fn(*mut c_void, *const c_char, usize)>;

extern "C" {
    pub fn tray_malloc(size: usize) -> *mut c_void;
    pub fn tray_calloc(count: usize, size: usize) -> *mut c_void;
    pub fn tray_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    pub fn tray_reallocarray(ptr: *mut c_void, count: usize, size: usize) -> *mut c_void;
    pub fn tray_free(ptr: *mut c_void);
    pub fn tray_free_sized(ptr: *mut c_void, size: usize);
    pub fn tray_free_aligned_sized(ptr: *mut c_void, alignment: usize, size: usize);
    pub fn tray_aligned_alloc(alignment: usize, size: usize) -> *mut c_void;
    pub fn tray_posix_memalign(out: *mut *mut c_void, alignment: usize, size: usize) -> c_int;
    pub fn tray_memalign(alignment: usize, size: usize) -> *mut c_void;
    pub fn tray_usable_size(ptr: *const c_void) -> usize;
    pub fn tray_owns(ptr: *const c_void) -> c_int;
    pub fn tray_trim() -> c_int;
    pub fn tray_prof_dump(path: *const c_char) -> c_int;
    pub fn tray_prof_dump_peak(path: *const c_char) -> c_int;

    pub fn tray_heap_new() -> *mut tray_heap_t;
    pub fn tray_heap_destroy(heap: *mut tray_heap_t);
    pub fn tray_heap_reset(heap: *mut tray_heap_t);
    pub fn tray_heap_malloc(heap: *mut tray_heap_t, size: usize) -> *mut c_void;
    pub fn tray_heap_calloc(heap: *mut tray_heap_t, count: usize, size: usize) -> *mut c_void;
    pub fn tray_heap_realloc(heap: *mut tray_heap_t, ptr: *mut c_void, size: usize) -> *mut c_void;
    pub fn tray_heap_aligned_alloc(
        heap: *mut tray_heap_t,
        alignment: usize,
        size: usize,
    ) -> *mut c_void;
    pub fn tray_heap_set_default(heap: *mut tray_heap_t) -> *mut tray_heap_t;
    pub fn tray_heap_of(ptr: *const c_void) -> *mut tray_heap_t;

    pub fn tray_option_set(name: *const c_char, value: *const c_char) -> c_int;
    pub fn tray_stats_get(out: *mut tray_stats) -> c_int;
    pub fn tray_stats_print(write: tray_write_fn, context: *mut c_void, flags: c_uint) -> c_int;
}
