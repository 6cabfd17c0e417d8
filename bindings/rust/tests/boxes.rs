//! Rust's allocations land in traymalloc once it is the global allocator: N boxes are N more
//! live blocks of their size class, and dropping them takes them back. One test in this
//! program, so no other test thread allocates between the two readings.

#[global_allocator]
static GLOBAL: traymalloc::TrayMalloc = traymalloc::TrayMalloc;

const BOXES: usize = 1000;
type Payload = [u64; 120]; // 960 bytes

fn live_blocks_of(size: usize) -> (u64, u64) {
    let stats = traymalloc::stats();
    let class = stats
        .class_for_size(size)
        .expect("a class holds the payload");
    (class.block_bytes, class.live_blocks)
}

#[test]
fn boxes_are_blocks_of_their_size_class() {
    let size = std::mem::size_of::<Payload>();
    let mut boxes: Vec<Box<Payload>> = Vec::with_capacity(BOXES);
    let (block_bytes, before) = live_blocks_of(size);
    for i in 0..BOXES {
        boxes.push(Box::new([i as u64; 120]));
    }
    let (_, during) = live_blocks_of(size);
    assert_eq!(during - before, BOXES as u64, "class of {} B", block_bytes);
    for (i, b) in boxes.iter().enumerate() {
        assert!(traymalloc::owns(b.as_ptr() as *const u8));
        assert!(b.iter().all(|&x| x == i as u64));
    }
    boxes.clear();
    let (_, after) = live_blocks_of(size);
    assert_eq!(after, before);

    // The vector, the strings and the maps of the standard library take the same road.
    let text: String = "traymalloc ".repeat(100);
    assert!(traymalloc::owns(text.as_ptr()));
}
