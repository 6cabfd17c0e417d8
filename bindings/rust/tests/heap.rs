//! traymalloc::Heap: blocks allocated into a heap, by one thread or several, are all freed by a
//! reset (the statistics see them go) and the heap takes allocations again; dropping the heap
//! frees what it holds. One test in this program, so no other test thread allocates between
//! the readings of the counters.

use std::alloc::Layout;
use std::thread;

use traymalloc::Heap;

const BLOCKS: usize = 5000;
const SIZE: usize = 700;

fn live_blocks(size: usize) -> u64 {
    traymalloc::stats()
        .class_for_size(size)
        .unwrap()
        .live_blocks
}

#[test]
fn reset_frees_every_block_and_the_heap_takes_more() {
    let mut heap = Heap::new().unwrap();
    let layout = Layout::from_size_align(SIZE, 8).unwrap();
    let before = live_blocks(SIZE);
    let mut blocks = Vec::with_capacity(BLOCKS);
    for i in 0..BLOCKS {
        let block = heap.alloc(layout).unwrap();
        unsafe { std::ptr::write_bytes(block.as_ptr(), i as u8, SIZE) };
        assert!(heap.contains(block.as_ptr()) && traymalloc::owns(block.as_ptr()));
        blocks.push(block);
    }
    assert_eq!(live_blocks(SIZE) - before, BLOCKS as u64);
    // Freeing some one by one first is allowed, and they are not freed twice by the reset.
    for block in blocks.drain(..100) {
        unsafe { heap.dealloc(block, layout) };
    }
    assert_eq!(live_blocks(SIZE) - before, (BLOCKS - 100) as u64);
    blocks.clear();
    heap.reset();
    assert_eq!(
        live_blocks(SIZE),
        before,
        "the reset left blocks of the heap live"
    );

    // Values, slices and strings borrow the heap; aligned blocks go to the aligned entry.
    for round in 0..3u64 {
        let value = heap.alloc_value([round; 64]);
        let slice = heap.alloc_slice_copy(&[round as u32; 100]);
        let text = heap.alloc_str("a string in the heap");
        let unit = heap.alloc_value(());
        let empty = heap.alloc_slice_copy::<u64>(&[]);
        assert_eq!(
            (value[63], slice[99], &*text, *unit, empty.len()),
            (round, round as u32, "a string in the heap", (), 0)
        );
        assert!(heap.contains(value.as_ptr() as *const u8) && heap.contains(text.as_ptr()));
        let aligned = Layout::from_size_align(3000, 4096).unwrap();
        let block = heap.alloc_zeroed(aligned).unwrap();
        assert_eq!(block.as_ptr() as usize % 4096, 0);
        assert!(unsafe { std::slice::from_raw_parts(block.as_ptr(), 3000) }
            .iter()
            .all(|&b| b == 0));
        let moved = unsafe { heap.realloc(block, aligned, 9000) }.unwrap();
        assert!(moved.as_ptr() as usize % 4096 == 0 && heap.contains(moved.as_ptr()));
        assert!(unsafe { std::slice::from_raw_parts(moved.as_ptr(), 3000) }
            .iter()
            .all(|&b| b == 0));
        heap.reset();
    }

    // Several threads fill the heap at once; the reset takes all their blocks. Each is joined
    // (the scope alone waits for the closures, not for the threads' exit, which is when their
    // counts are settled).
    thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let heap = &heap;
                scope.spawn(move || {
                    for i in 0..BLOCKS / 4 {
                        let value = heap.alloc_value([i as u8; SIZE]);
                        assert_eq!(value[SIZE - 1], i as u8);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
    });
    assert_eq!(live_blocks(SIZE) - before, BLOCKS as u64);
    heap.reset();
    assert_eq!(live_blocks(SIZE), before);

    // A heap sent to another thread and dropped there frees its blocks.
    for _ in 0..BLOCKS {
        heap.alloc(layout).unwrap();
    }
    thread::spawn(move || drop(heap)).join().unwrap();
    assert_eq!(live_blocks(SIZE), before);
}
