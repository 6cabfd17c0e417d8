//! Builds the allocator's core (`traymalloc_core`: the `tray_*` API without the malloc
//! overrides) from the source tree with CMake and links it statically, or, with
//! `TRAYMALLOC_SYSTEM=1`, links the traymalloc that `pkg-config traymalloc` finds.
//!
//! Environment:
//! - `TRAYMALLOC_SYSTEM`: set and not `0`: link the installed library instead of building one.
//! - `TRAYMALLOC_CMAKE_ARGS`: more arguments for CMake's configure step, split at whitespace
//!   (`-DTRAY_TLS_MODEL=global-dynamic`, `-DCMAKE_TOOLCHAIN_FILE=...` for a cross build).
//! - `CMAKE`: the cmake program (default `cmake`); `PKG_CONFIG`: the pkg-config program.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in [
        "TRAYMALLOC_SYSTEM",
        "TRAYMALLOC_CMAKE_ARGS",
        "CMAKE",
        "CMAKE_GENERATOR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }

    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os != "linux" || (arch != "x86_64" && arch != "aarch64") {
        panic!(
            "traymalloc runs on Linux on x86-64 and arm64 only (target: {} {})",
            os, arch
        );
    }

    let system = env::var_os("TRAYMALLOC_SYSTEM").map_or(false, |v| !v.is_empty() && v != "0");
    if system {
        link_installed();
    } else {
        build_from_tree();
    }
}

/// Links what `pkg-config --libs traymalloc` names: the shared libtraymalloc.so of an install,
/// which also replaces malloc for the C and C++ code of the program.
fn link_installed() {
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    let pkg_config = env::var_os("PKG_CONFIG").unwrap_or_else(|| OsString::from("pkg-config"));
    let output = Command::new(&pkg_config)
        .args(["--libs", "traymalloc"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "TRAYMALLOC_SYSTEM is set but {:?} did not run: {}",
                pkg_config, e
            )
        });
    if !output.status.success() {
        panic!(
            "TRAYMALLOC_SYSTEM is set but `pkg-config --libs traymalloc` failed (is traymalloc \
             installed, and its traymalloc.pc in PKG_CONFIG_PATH?):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let flags = String::from_utf8_lossy(&output.stdout);
    let mut linked = false;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={}", dir);
        } else if let Some(name) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={}", name);
            linked |= name == "traymalloc";
        }
        // The .pc's -Wl,-rpath applies to the final program, which a library's build script
        // cannot set for its dependents (cargo:rustc-link-arg reaches only this package's own
        // tests and binaries); README.md says how to find a library outside the loader's path.
    }
    if !linked {
        panic!(
            "`pkg-config --libs traymalloc` did not name -ltraymalloc: {}",
            flags.trim()
        );
    }
}

fn build_from_tree() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let source = manifest.join("../..");
    if !source.join("CMakeLists.txt").is_file() || !source.join("include/traymalloc.h").is_file() {
        panic!(
            "the traymalloc source tree is not at {}: this crate builds the library from the \
             tree it sits in; set TRAYMALLOC_SYSTEM=1 to link an installed traymalloc instead",
            source.display()
        );
    }
    for part in ["CMakeLists.txt", "lib", "include", "cmake"] {
        println!("cargo:rerun-if-changed={}", source.join(part).display());
    }

    let extra = env::var("TRAYMALLOC_CMAKE_ARGS").unwrap_or_default();
    if env::var("TARGET").ok() != env::var("HOST").ok() && !extra.contains("CMAKE_TOOLCHAIN_FILE") {
        panic!(
            "cross-compiling for {}: give CMake a toolchain for it, e.g. \
             TRAYMALLOC_CMAKE_ARGS=-DCMAKE_TOOLCHAIN_FILE=$PWD/cmake/aarch64-linux-gnu.cmake",
            env::var("TARGET").unwrap_or_default()
        );
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let build = out_dir.join("cmake-build");
    let cmake = env::var_os("CMAKE").unwrap_or_else(|| OsString::from("cmake"));

    // The allocator is always built optimised: a debug build of the Rust program still wants a
    // fast malloc, and an unoptimised allocator would dominate its tests' time. Tests, benchmarks
    // and the override libraries are left out: only traymalloc_core is built. BUILD_TESTING and
    // TRAY_BUILD_TESTS are both given, so whichever the CMakeLists reads, tests stay off.
    let mut configure: Vec<String> = vec![
        "-DCMAKE_BUILD_TYPE=Release".into(),
        "-DBUILD_TESTING=OFF".into(),
        "-DTRAY_BUILD_TESTS=OFF".into(),
        "-DTRAY_BUILD_BENCH=OFF".into(),
        "-DTRAY_BUILD_OVERRIDE=OFF".into(),
        "--no-warn-unused-cli".into(),
    ];
    if env::var_os("CMAKE_GENERATOR").is_none() && runs(Command::new("ninja").arg("--version")) {
        configure.push("-GNinja".into());
    }
    configure.extend(extra.split_whitespace().map(String::from));

    // Configure once per OUT_DIR (and again only if the arguments change): `cmake --build`
    // reruns the configure step by itself when a CMakeLists.txt changes.
    // CMake reads CMAKE_GENERATOR itself, and refuses another generator in an existing tree.
    let stamp = out_dir.join("cmake-configure-args");
    let stamp_text = format!(
        "{}\nCMAKE_GENERATOR={}",
        configure.join("\n"),
        env::var("CMAKE_GENERATOR").unwrap_or_default()
    );
    let configured = build.join("CMakeCache.txt").is_file()
        && fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text.as_str());
    if !configured {
        let _ = fs::remove_dir_all(&build);
        let mut command = Command::new(&cmake);
        command
            .arg("-S")
            .arg(&source)
            .arg("-B")
            .arg(&build)
            .args(&configure);
        run(&mut command, "configure");
        fs::write(&stamp, &stamp_text).expect("write the configure stamp");
    }

    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "1".into());
    let mut command = Command::new(&cmake);
    command
        .arg("--build")
        .arg(&build)
        .args(["--target", "traymalloc_core", "-j", &jobs]);
    run(&mut command, "build");

    let lib_dir = build.join("lib");
    if !lib_dir.join("libtraymalloc_core.a").is_file() {
        panic!(
            "the CMake build made no {}",
            lib_dir.join("libtraymalloc_core.a").display()
        );
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=static=traymalloc_core");
    // What the core calls outside libc (nm -u of the archive): pthread_atfork, pthread_create
    // and the other thread calls, dladdr and dlsym; no C++ runtime (-fno-exceptions -fno-rtti,
    // nothing of libstdc++ but headers). On glibc 2.34 and later both are in libc itself.
    println!("cargo:rustc-link-lib=pthread");
    println!("cargo:rustc-link-lib=dl");
    println!("cargo:include={}", source.join("include").display());
}

fn runs(command: &mut Command) -> bool {
    command.output().map_or(false, |o| o.status.success())
}

/// Runs a CMake step; its output goes to the build script's stderr, where cargo shows it when
/// the build fails (its stdout would be read for cargo: directives).
fn run(command: &mut Command, step: &str) {
    let output = command.output().unwrap_or_else(|e| {
        panic!(
            "could not run {:?} ({}); install CMake or set CMAKE to its path",
            command, e
        )
    });
    eprint!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        panic!("CMake's {} step failed: {:?}", step, command);
    }
}
