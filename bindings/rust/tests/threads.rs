//! Vectors, strings and maps built in one thread and dropped in another, with traymalloc as the
//! global allocator: the blocks freed by a thread that did not allocate them go back to their
//! owner's heap.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;

#[global_allocator]
static GLOBAL: traymalloc::TrayMalloc = traymalloc::TrayMalloc;

const THREADS: usize = 4;
const ROUNDS: usize = 200;

fn build(seed: usize) -> (Vec<u64>, String, HashMap<String, Vec<u8>>) {
    let vector: Vec<u64> = (0..(seed % 300) as u64 + 1)
        .map(|x| x * 7 + seed as u64)
        .collect();
    let text = format!("payload {} ", seed).repeat(seed % 50 + 1);
    let mut map = HashMap::new();
    for k in 0..seed % 40 + 1 {
        map.insert(
            format!("key {} {}", seed, k),
            vec![(k % 251) as u8; k * 13 + 1],
        );
    }
    (vector, text, map)
}

fn check(seed: usize, (vector, text, map): &(Vec<u64>, String, HashMap<String, Vec<u8>>)) {
    assert_eq!(vector.len(), seed % 300 + 1);
    assert!(vector
        .iter()
        .enumerate()
        .all(|(i, &x)| x == i as u64 * 7 + seed as u64));
    assert_eq!(*text, format!("payload {} ", seed).repeat(seed % 50 + 1));
    assert_eq!(map.len(), seed % 40 + 1);
    for (key, value) in map {
        let k: usize = key.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(*value, vec![(k % 251) as u8; k * 13 + 1]);
    }
    assert!(traymalloc::owns(vector.as_ptr() as *const u8) && traymalloc::owns(text.as_ptr()));
}

#[test]
fn collections_built_in_one_thread_are_dropped_in_another() {
    // A ring: thread i builds, hands to thread i+1, which checks and drops.
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel()).unzip();
    let mut handles = Vec::new();
    for (i, receiver) in receivers.into_iter().enumerate() {
        let next = senders[(i + 1) % THREADS].clone();
        handles.push(thread::spawn(move || {
            for round in 0..ROUNDS {
                let seed = round * THREADS + i;
                next.send((seed, build(seed))).unwrap();
                let (their_seed, theirs) = receiver.recv().unwrap();
                check(their_seed, &theirs);
            }
        }));
    }
    drop(senders);
    for handle in handles {
        handle.join().unwrap();
    }
    let stats = traymalloc::stats();
    assert!(
        stats.remote_frees > 0,
        "no block was freed by a thread that did not own it"
    );
}

#[test]
fn a_map_filled_by_many_threads_is_read_and_dropped_by_main() {
    let parts: Vec<HashMap<usize, String>> = (0..THREADS)
        .map(|t| {
            thread::spawn(move || {
                (0..2000)
                    .map(|k| (k * THREADS + t, k.to_string()))
                    .collect()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let mut all = HashMap::new();
    for part in parts {
        all.extend(part);
    }
    assert_eq!(all.len(), THREADS * 2000);
    for (key, value) in &all {
        assert_eq!(*value, (key / THREADS).to_string());
        assert!(traymalloc::owns(value.as_ptr()));
    }
}
