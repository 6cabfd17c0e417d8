use std::any::Any;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::slice;

use crate::ffi;

/// The allocator's counters (`tray_stats`), process-wide: exact for the calling thread's blocks
/// and for threads that ended; other running threads' trail by at most the blocks of the pages
/// they use. docs/GUIDE.md, "Statistics", says what each one counts and how exact it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// The `tray_stats` version the library filled: 4 for this tree's, less for an older
    /// installed library, which leaves the newer fields `None`.
    pub version: u32,
    /// One entry per size class, smallest blocks first.
    pub classes: Vec<ClassStats>,
    /// Blocks above the largest class (128 KiB).
    pub large: LargeStats,
    /// Address space held from the OS, metadata included.
    pub mapped_bytes: u64,
    /// Of which not given back to the OS.
    pub committed_bytes: u64,
    /// Resident size of the whole process.
    pub resident_bytes: u64,
    /// Total ever given back to the OS.
    pub released_bytes: u64,
    pub metadata_bytes: u64,
    pub segments: u64,
    /// Threads that own a heap now.
    pub threads_alive: u64,
    pub threads_exited: u64,
    pub heaps_created: u64,
    /// Frees of a block owned by another thread's heap.
    pub remote_frees: u64,
    /// Frees of pointers traymalloc does not own.
    pub foreign_frees: u64,
    /// Errors debug mode reported (with `debug_abort=0`).
    pub debug_errors: u64,
    pub os_mmap: u64,
    pub os_munmap: u64,
    pub os_madvise: u64,
    pub os_mremap: u64,
    pub os_mprotect: u64,
    /// Address space of the unit map's leaves (version 2 and later).
    pub unit_map_bytes: Option<u64>,
    /// The memory limit (version 3 and later).
    pub memory_limit: Option<MemoryLimitStats>,
    /// Of the remote frees, blocks the freeing thread kept and allocated again itself
    /// (version 5 and later).
    pub reused_blocks: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Size of every block of the class.
    pub block_bytes: u64,
    /// Size of one page of the class.
    pub page_bytes: u64,
    pub blocks_per_page: u64,
    /// Allocations less frees.
    pub live_blocks: u64,
    pub peak_live_blocks: u64,
    /// Since the start of the process.
    pub allocations: u64,
    pub frees: u64,
    /// Pages the class holds now.
    pub pages: u64,
    pub peak_pages: u64,
    /// Sum of the sizes asked for, over all allocations; an estimate since version 4 (each list
    /// of blocks a thread takes in counts at the size of the request that took it in).
    pub requested_bytes: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LargeStats {
    pub allocations: u64,
    pub frees: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// Address space of live and cached large blocks.
    pub mapped_bytes: u64,
    /// Freed large memory kept for reuse.
    pub cached_blocks: u64,
    pub cached_bytes: u64,
}

/// docs/GUIDE.md, "Memory limit".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryLimitStats {
    /// The limit (0: none).
    pub bytes: u64,
    /// Whether it is the cgroup's (less a margin) rather than the `memory_limit` option's.
    pub from_cgroup: bool,
    /// Whether reaching it fails allocations (`memory_limit_action=fail`).
    pub fail: bool,
    /// How often an allocation found it passed.
    pub reached: u64,
    /// How many of those failed.
    pub failures: u64,
    /// What giving back then returned to the OS.
    pub released_bytes: u64,
}

impl Stats {
    /// The class a request of `size` bytes with the natural alignment is served from: the
    /// smallest whose blocks hold it; `None` above the largest class.
    pub fn class_for_size(&self, size: usize) -> Option<&ClassStats> {
        self.classes.iter().find(|c| c.block_bytes >= size as u64)
    }
}

/// Reads the allocator's counters.
///
/// The newest `tray_stats` version this crate knows is asked for first; a library older than
/// the crate (an installed one, with `TRAYMALLOC_SYSTEM=1`) refuses it with `EINVAL`, and the
/// older versions are tried in turn, as the header's version protocol lays out.
///
/// # Panics
/// If the library knows none of the versions 1 to 5, which no traymalloc does.
pub fn stats() -> Stats {
    let mut raw = MaybeUninit::<ffi::tray_stats>::zeroed();
    for version in (1..=ffi::TRAY_STATS_VERSION).rev() {
        // The struct has the newest layout, which holds every older one as a prefix.
        unsafe { (*raw.as_mut_ptr()).version = version };
        if unsafe { ffi::tray_stats_get(raw.as_mut_ptr()) } == 0 {
            return from_raw(unsafe { &*raw.as_ptr() }, version);
        }
    }
    panic!(
        "traymalloc: tray_stats_get refused every version from 1 to {}",
        ffi::TRAY_STATS_VERSION
    )
}

fn from_raw(raw: &ffi::tray_stats, version: u32) -> Stats {
    let count = (raw.class_count as usize).min(ffi::TRAY_STATS_MAX_CLASSES);
    let l = &raw.large;
    Stats {
        version,
        classes: raw.classes[..count]
            .iter()
            .map(|c| ClassStats {
                block_bytes: c.block_bytes,
                page_bytes: c.page_bytes,
                blocks_per_page: c.blocks_per_page,
                live_blocks: c.live_blocks,
                peak_live_blocks: c.peak_live_blocks,
                allocations: c.allocations,
                frees: c.frees,
                pages: c.pages,
                peak_pages: c.peak_pages,
                requested_bytes: c.requested_bytes,
            })
            .collect(),
        large: LargeStats {
            allocations: l.allocations,
            frees: l.frees,
            live_blocks: l.live_blocks,
            live_bytes: l.live_bytes,
            peak_bytes: l.peak_bytes,
            mapped_bytes: l.mapped_bytes,
            cached_blocks: l.cached_blocks,
            cached_bytes: l.cached_bytes,
        },
        mapped_bytes: raw.mapped_bytes,
        committed_bytes: raw.committed_bytes,
        resident_bytes: raw.resident_bytes,
        released_bytes: raw.released_bytes,
        metadata_bytes: raw.metadata_bytes,
        segments: raw.segments,
        threads_alive: raw.threads_alive,
        threads_exited: raw.threads_exited,
        heaps_created: raw.heaps_created,
        remote_frees: raw.remote_frees,
        foreign_frees: raw.foreign_frees,
        debug_errors: raw.debug_errors,
        os_mmap: raw.os_mmap,
        os_munmap: raw.os_munmap,
        os_madvise: raw.os_madvise,
        os_mremap: raw.os_mremap,
        os_mprotect: raw.os_mprotect,
        unit_map_bytes: if version >= 2 {
            Some(raw.unit_map_bytes)
        } else {
            None
        },
        memory_limit: if version >= 3 {
            Some(MemoryLimitStats {
                bytes: raw.memory_limit_bytes,
                from_cgroup: raw.memory_limit_from_cgroup != 0,
                fail: raw.memory_limit_fail != 0,
                reached: raw.memory_limit_reached,
                failures: raw.memory_limit_failures,
                released_bytes: raw.memory_limit_released_bytes,
            })
        } else {
            None
        },
        reused_blocks: if version >= 5 {
            Some(raw.reused_blocks)
        } else {
            None
        },
    }
}

/// The format of a statistics dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    /// An aligned table in human units, as the dump at exit (`TRAY_OPTIONS=stats=1`).
    Text,
    /// One JSON object on one line (its format: docs/GUIDE.md, "Statistics").
    Json,
}

/// Writes the text dump of the statistics to stderr, without allocating.
pub fn dump_stats() {
    // EBUSY is possible only from a signal handler that interrupted a dump of the same thread.
    unsafe { ffi::tray_stats_print(None, ptr::null_mut(), ffi::TRAY_STATS_TEXT) };
}

/// Writes a statistics dump to `out`. The counters are read once, before the first write, so
/// what `out` allocates does not show in the dump. Dumps of different threads take turns.
pub fn write_stats<W: Write>(out: &mut W, format: StatsFormat) -> io::Result<()> {
    let flags = match format {
        StatsFormat::Text => ffi::TRAY_STATS_TEXT,
        StatsFormat::Json => ffi::TRAY_STATS_JSON,
    };
    let mut sink = Sink {
        out,
        error: None,
        panic: None,
    };
    let result = unsafe {
        ffi::tray_stats_print(
            Some(write_piece::<W>),
            &mut sink as *mut Sink<W> as *mut c_void,
            flags,
        )
    };
    if let Some(payload) = sink.panic {
        panic::resume_unwind(payload);
    }
    if let Some(error) = sink.error {
        return Err(error);
    }
    match result {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno as c_int)),
    }
}

struct Sink<'a, W> {
    out: &'a mut W,
    error: Option<io::Error>,
    panic: Option<Box<dyn Any + Send + 'static>>,
}

/// Called by the C library with each piece of the dump. A panic must not unwind through C, so
/// it is caught here and resumed once the dump has returned; after an error or a panic the
/// rest of the dump is dropped.
unsafe extern "C" fn write_piece<W: Write>(
    context: *mut c_void,
    text: *const c_char,
    length: usize,
) {
    let sink = &mut *(context as *mut Sink<W>);
    if sink.error.is_some() || sink.panic.is_some() {
        return;
    }
    let bytes = slice::from_raw_parts(text as *const u8, length);
    match panic::catch_unwind(AssertUnwindSafe(|| sink.out.write_all(bytes))) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => sink.error = Some(error),
        Err(payload) => sink.panic = Some(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{size_of, MaybeUninit};

    #[test]
    fn the_struct_has_the_headers_layout() {
        // sizeof and offsetof of include/traymalloc.h's tray_stats (version 5) on LP64.
        let raw = MaybeUninit::<ffi::tray_stats>::uninit();
        let base = raw.as_ptr() as usize;
        let offset = |field: *const u64| field as usize - base;
        let p = raw.as_ptr();
        unsafe {
            assert_eq!(size_of::<ffi::tray_stats>(), 5392);
            assert_eq!(offset(ptr::addr_of!((*p).large.allocations)), 5128);
            assert_eq!(offset(ptr::addr_of!((*p).mapped_bytes)), 5192);
            assert_eq!(offset(ptr::addr_of!((*p).unit_map_bytes)), 5328);
            assert_eq!(offset(ptr::addr_of!((*p).memory_limit_bytes)), 5336);
            assert_eq!(offset(ptr::addr_of!((*p).reused_blocks)), 5384);
        }
    }

    #[test]
    fn stats_read_the_newest_version_and_every_class() {
        let s = stats();
        assert_eq!(s.version, ffi::TRAY_STATS_VERSION);
        assert!(s.classes.len() >= 2);
        assert!(s
            .classes
            .windows(2)
            .all(|w| w[0].block_bytes < w[1].block_bytes));
        assert_eq!(s.classes[0].block_bytes, 16);
        assert!(s.unit_map_bytes.is_some() && s.memory_limit.is_some() && s.reused_blocks.is_some());
        assert_eq!(
            s.class_for_size(17).map(|c| c.block_bytes >= 17),
            Some(true)
        );
        assert!(s.class_for_size(usize::MAX).is_none());
    }

    #[test]
    fn json_dump_is_one_line() {
        let mut out = Vec::new();
        write_stats(&mut out, StatsFormat::Json).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with('{') && text.trim_end().ends_with('}'),
            "{}",
            text
        );
        assert_eq!(text.trim_end().lines().count(), 1);
    }

    #[test]
    fn a_failing_writer_is_an_error_and_a_panicking_one_panics_after_the_dump() {
        struct Failing;
        impl Write for Failing {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::Other, "full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let error = write_stats(&mut Failing, StatsFormat::Text).unwrap_err();
        assert_eq!(error.to_string(), "full");

        struct Panicking;
        impl Write for Panicking {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                panic!("writer panicked")
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let caught = panic::catch_unwind(|| write_stats(&mut Panicking, StatsFormat::Text));
        assert!(caught.is_err());
        // The dump ended: the next one does not wait for its turn forever.
        write_stats(&mut Vec::new(), StatsFormat::Text).unwrap();
    }
}
