//! Layouts aligned above traymalloc's natural 16 bytes, through the global allocator: every
//! block keeps its alignment when allocated, zeroed and reallocated, and realloc keeps the
//! contents.

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

#[global_allocator]
static GLOBAL: traymalloc::TrayMalloc = traymalloc::TrayMalloc;

const SIZES: [usize; 9] = [1, 24, 100, 1000, 4097, 20_000, 130_000, 300_000, 5 << 20];

fn fill(p: *mut u8, size: usize, seed: u8) {
    let bytes = unsafe { std::slice::from_raw_parts_mut(p, size) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

fn holds(p: *const u8, size: usize, seed: u8) -> bool {
    let bytes = unsafe { std::slice::from_raw_parts(p, size) };
    bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i as u8).wrapping_mul(31).wrapping_add(seed))
}

fn aligns() -> impl Iterator<Item = usize> {
    (0..=12).map(|shift| 1usize << shift) // 1 B .. 4 KiB
}

/// A block traymalloc handed out for `what`, aligned to `align`.
fn check_block(p: *mut u8, align: usize, what: &str) {
    assert!(!p.is_null(), "{}: null", what);
    assert_eq!(p as usize % align, 0, "{}: misaligned", what);
    assert!(traymalloc::owns(p), "{}: not traymalloc's", what);
}

#[test]
fn blocks_keep_their_alignment_through_alloc_and_realloc() {
    for align in aligns() {
        for (n, &size) in SIZES.iter().enumerate() {
            let seed = n as u8;
            let layout = Layout::from_size_align(size, align).unwrap();
            unsafe {
                let p = alloc(layout);
                check_block(p, align, &format!("alloc {} B aligned {}", size, align));
                fill(p, size, seed);
                // Grow, then shrink below the first size: contents and alignment stay.
                let grown_size = size + size / 2 + 5000;
                let grown = realloc(p, layout, grown_size);
                let what = format!("realloc {} -> {} B aligned {}", size, grown_size, align);
                check_block(grown, align, &what);
                assert!(holds(grown, size, seed), "{}: contents", what);
                fill(grown, grown_size, seed.wrapping_add(1));
                let grown_layout = Layout::from_size_align(grown_size, align).unwrap();
                let small_size = size / 2 + 1;
                let small = realloc(grown, grown_layout, small_size);
                let what = format!(
                    "realloc {} -> {} B aligned {}",
                    grown_size, small_size, align
                );
                check_block(small, align, &what);
                assert!(
                    holds(small, small_size, seed.wrapping_add(1)),
                    "{}: contents",
                    what
                );
                dealloc(small, Layout::from_size_align(small_size, align).unwrap());
            }
        }
    }
}

#[test]
fn zeroed_blocks_are_zero_and_aligned() {
    for align in aligns() {
        for &size in &SIZES {
            let layout = Layout::from_size_align(size, align).unwrap();
            unsafe {
                // Dirty a block of the same layout first, so a reused one must be cleared.
                let dirty = alloc(layout);
                std::ptr::write_bytes(dirty, 0xa5, size);
                dealloc(dirty, layout);
                let p = alloc_zeroed(layout);
                check_block(
                    p,
                    align,
                    &format!("alloc_zeroed {} B aligned {}", size, align),
                );
                assert!(
                    std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0),
                    "{} B aligned {}",
                    size,
                    align
                );
                dealloc(p, layout);
            }
        }
    }
}

#[test]
fn a_vector_of_page_aligned_values_grows_in_place_or_moves_aligned() {
    #[derive(Clone, Copy)]
    #[repr(C, align(4096))]
    struct Page([u32; 1024]);
    let mut pages: Vec<Page> = Vec::new();
    for i in 0..100u32 {
        pages.push(Page([i; 1024]));
        assert_eq!(pages.as_ptr() as usize % 4096, 0);
    }
    assert!(pages
        .iter()
        .enumerate()
        .all(|(i, p)| p.0.iter().all(|&x| x == i as u32)));
    pages.truncate(3);
    pages.shrink_to_fit();
    assert_eq!(pages.as_ptr() as usize % 4096, 0);
    assert!(pages
        .iter()
        .enumerate()
        .all(|(i, p)| p.0.iter().all(|&x| x == i as u32)));
}
