//! A block freed twice through the global allocator stops the program in a release build of
//! traymalloc (its hardening, on by default), with its message on stderr. The test runs itself
//! again as a child process, which does the double free.

use std::alloc::{GlobalAlloc, Layout};
use std::env;
use std::os::unix::process::ExitStatusExt;
use std::process::{self, Command};

#[global_allocator]
static GLOBAL: traymalloc::TrayMalloc = traymalloc::TrayMalloc;

const CHILD: &str = "TRAYMALLOC_TEST_DOUBLE_FREE_CHILD";
/// The child's exit status when it gets past the second free.
const NOT_STOPPED: i32 = 3;

fn free_twice() -> ! {
    let layout = Layout::from_size_align(48, 8).unwrap();
    unsafe {
        let p = GLOBAL.alloc(layout);
        assert!(!p.is_null());
        p.write_bytes(0x5a, layout.size());
        GLOBAL.dealloc(p, layout);
        GLOBAL.dealloc(p, layout);
    }
    eprintln!("the second free returned");
    process::exit(NOT_STOPPED);
}

#[test]
fn a_double_free_is_stopped_with_traymallocs_message() {
    if env::var_os(CHILD).is_some() {
        free_twice();
    }
    let output = Command::new(env::current_exe().unwrap())
        .args([
            "--exact",
            "a_double_free_is_stopped_with_traymallocs_message",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD, "1")
        // Debug mode reports a double free in words of its own; this is about release builds.
        .env_remove("TRAY_OPTIONS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.signal(),
        Some(6),
        "not killed by SIGABRT ({}); stderr:\n{}",
        output.status,
        stderr
    );
    assert!(
        stderr.contains("traymalloc: double free of 0x") && stderr.contains("(size class 48 B)"),
        "stderr:\n{}",
        stderr
    );
}
