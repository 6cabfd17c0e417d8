use std::alloc::{handle_alloc_error, Layout};
use std::fmt;
use std::io;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::slice;
use std::str;

use crate::{ffi, realloc_aligned, NATURAL_ALIGNMENT};

/// A traymalloc heap (`tray_heap_t`): blocks allocated into it are freed all at once by
/// [`reset`](Heap::reset) or when the heap is dropped, at a cost that grows with the heap's
/// pages, not its blocks. Any number of threads may allocate into one heap at once (it is
/// `Sync`); docs/GUIDE.md, "Heaps", has the details and the costs.
///
/// Two ways to allocate:
///
/// - [`alloc_value`](Heap::alloc_value), [`alloc_slice_copy`](Heap::alloc_slice_copy) and
///   [`alloc_str`](Heap::alloc_str) return references that borrow the heap. A reset or a drop
///   needs the heap exclusively (`&mut self`, or ownership), so the borrow checker proves that
///   none of those references is alive when their memory is freed: both are safe. The values'
///   destructors never run (as with [`std::mem::forget`]), which is safe too, but leaks what
///   they own elsewhere, such as a `Vec`'s buffer in the global allocator.
/// - [`alloc`](Heap::alloc) and its siblings return raw blocks, for data structures that manage
///   their memory themselves. Their pointers carry no lifetime: reading or writing through one
///   is `unsafe`, and promises among other things that the block has not been freed, neither
///   on its own nor by a reset or drop of its heap.
///
/// The C API forbids a reset or destroy while any thread allocates into the heap; here every
/// allocation borrows the heap, so that cannot happen. What `unsafe` code does through
/// [`as_raw`](Heap::as_raw) and [`ffi`] (making the heap a thread's default with
/// `tray_heap_set_default`, for instance) is bound by the C contract instead.
///
/// ```
/// let mut heap = traymalloc::Heap::new().unwrap();
/// for round in 0..3 {
///     let name = heap.alloc_str("frame");
///     let count = heap.alloc_value(round);
///     assert_eq!((&*name, *count), ("frame", round));
///     heap.reset(); // name and count are gone; the borrow checker rejects any later use
/// }
/// ```
///
/// A reference that outlives its reset, or its heap, does not compile:
///
/// ```compile_fail,E0502
/// let mut heap = traymalloc::Heap::new().unwrap();
/// let name = heap.alloc_str("freed by the reset");
/// heap.reset();
/// println!("{}", name);
/// ```
///
/// ```compile_fail,E0505
/// let heap = traymalloc::Heap::new().unwrap();
/// let name = heap.alloc_str("freed with the heap");
/// drop(heap);
/// println!("{}", name);
/// ```
pub struct Heap {
    raw: NonNull<ffi::tray_heap_t>,
}

// The C API lets any thread allocate into a heap, free its blocks, and reset or destroy it
// (the last two while nobody allocates into it, which `&mut self` and ownership ensure).
unsafe impl Send for Heap {}
unsafe impl Sync for Heap {}

impl Heap {
    /// A new, empty heap; the error is `ENOMEM` when out of memory.
    pub fn new() -> io::Result<Heap> {
        match NonNull::new(unsafe { ffi::tray_heap_new() }) {
            Some(raw) => Ok(Heap { raw }),
            None => Err(io::Error::last_os_error()),
        }
    }

    /// The C handle, for the functions of [`ffi`]; it stays the heap's.
    pub fn as_raw(&self) -> *mut ffi::tray_heap_t {
        self.raw.as_ptr()
    }

    /// A block of `layout` in this heap, or `None` when out of memory (or for an alignment above
    /// [`MAX_ALIGNMENT`](crate::MAX_ALIGNMENT)). A size of 0 gives a block of the smallest class.
    pub fn alloc(&self, layout: Layout) -> Option<NonNull<u8>> {
        let raw = self.as_raw();
        NonNull::new(unsafe {
            if layout.align() <= NATURAL_ALIGNMENT {
                ffi::tray_heap_malloc(raw, layout.size()) as *mut u8
            } else {
                ffi::tray_heap_aligned_alloc(raw, layout.align(), layout.size()) as *mut u8
            }
        })
    }

    /// As [`alloc`](Heap::alloc), and the block's bytes are zero.
    pub fn alloc_zeroed(&self, layout: Layout) -> Option<NonNull<u8>> {
        if layout.align() <= NATURAL_ALIGNMENT {
            return NonNull::new(
                unsafe { ffi::tray_heap_calloc(self.as_raw(), 1, layout.size()) } as *mut u8,
            );
        }
        let block = self.alloc(layout)?;
        unsafe { ptr::write_bytes(block.as_ptr(), 0, layout.size()) };
        Some(block)
    }

    /// Resizes a block to `new_size` bytes with `layout`'s alignment; the result is a block of
    /// this heap, with the contents up to the smaller size. `None` when out of memory: the old
    /// block is untouched then.
    ///
    /// # Safety
    /// `ptr` is a live block allocated with `layout` by traymalloc (this heap, another one, or
    /// [`TrayMalloc`](crate::TrayMalloc)); unless the result is `None`, it is freed.
    /// `new_size` is above 0, as for [`GlobalAlloc::realloc`](std::alloc::GlobalAlloc::realloc).
    pub unsafe fn realloc(
        &self,
        ptr: NonNull<u8>,
        layout: Layout,
        new_size: usize,
    ) -> Option<NonNull<u8>> {
        let raw = self.as_raw();
        NonNull::new(if layout.align() <= NATURAL_ALIGNMENT {
            ffi::tray_heap_realloc(raw, ptr.as_ptr() as *mut c_void, new_size) as *mut u8
        } else {
            realloc_aligned(ptr.as_ptr(), layout, new_size, |align, size| {
                ffi::tray_heap_aligned_alloc(raw, align, size) as *mut u8
            })
        })
    }

    /// Frees one block before the heap's reset or drop.
    ///
    /// # Safety
    /// `ptr` is a live block allocated with `layout` by traymalloc, and is not used again.
    pub unsafe fn dealloc(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.align() <= NATURAL_ALIGNMENT {
            ffi::tray_free_sized(ptr.as_ptr() as *mut c_void, layout.size());
        } else {
            ffi::tray_free_aligned_sized(
                ptr.as_ptr() as *mut c_void,
                layout.align(),
                layout.size(),
            );
        }
    }

    /// Whether `ptr`, the start of a block traymalloc handed out, is a block of this heap (an
    /// address inside a large block answers false).
    pub fn contains(&self, ptr: *const u8) -> bool {
        unsafe { ffi::tray_heap_of(ptr as *const c_void) == self.as_raw() }
    }

    /// Moves `value` into the heap. Its destructor never runs. Out of memory ends the process
    /// as it does for `Box::new` ([`handle_alloc_error`]).
    #[allow(clippy::mut_from_ref)] // each call returns a block of its own
    pub fn alloc_value<T>(&self, value: T) -> &mut T {
        let block = self.alloc_or_abort(Layout::new::<T>()).cast::<T>();
        unsafe {
            block.as_ptr().write(value);
            &mut *block.as_ptr()
        }
    }

    /// Copies `src` into the heap.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice_copy<T: Copy>(&self, src: &[T]) -> &mut [T] {
        let layout = Layout::array::<T>(src.len()).unwrap_or_else(|_| capacity_overflow());
        let block = self.alloc_or_abort(layout).cast::<T>();
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), block.as_ptr(), src.len());
            slice::from_raw_parts_mut(block.as_ptr(), src.len())
        }
    }

    /// Copies `src` into the heap.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_str(&self, src: &str) -> &mut str {
        let bytes = self.alloc_slice_copy(src.as_bytes());
        unsafe { str::from_utf8_unchecked_mut(bytes) }
    }

    /// Frees every block of the heap; the heap stays, empty, and keeps a little of its memory
    /// for what comes next. Safe: see the type's documentation.
    pub fn reset(&mut self) {
        unsafe { ffi::tray_heap_reset(self.as_raw()) }
    }

    /// A block of `layout`, dangling (and never freed, which it need not be) when the size is
    /// 0, so that zero-sized values and empty slices take no memory.
    fn alloc_or_abort(&self, layout: Layout) -> NonNull<u8> {
        if layout.size() == 0 {
            // Non-null and aligned, as a reference to a zero-sized value must be.
            return unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
        }
        self.alloc(layout)
            .unwrap_or_else(|| handle_alloc_error(layout))
    }
}

impl Drop for Heap {
    /// Frees every block of the heap, and the heap is gone.
    fn drop(&mut self) {
        unsafe { ffi::tray_heap_destroy(self.as_raw()) }
    }
}

impl fmt::Debug for Heap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Heap").field(&self.raw).finish()
    }
}

fn capacity_overflow() -> ! {
    panic!("traymalloc::Heap: the slice's size overflows isize")
}
