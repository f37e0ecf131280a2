//! The core's invariant, checked as ordinary tests: it names no I/O dependency and its sources
//! do no I/O and read no clock (`now` is always an argument).

use std::path::Path;

/// The crate's own directory, read at test time (the tests themselves may do I/O).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_core_names_no_io_dependency() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let deps =
        manifest.split("[dependencies]").nth(1).expect("a [dependencies] table").split("\n[").next().unwrap();
    let named: Vec<&str> = deps
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['=', '.', ' ']).next())
        .collect();
    assert_eq!(named, ["gpum-protocol", "sha2", "workspace-hack"], "the core's dependencies");
    for io in [
        "tokio",
        "rusqlite",
        "postgres",
        "axum",
        "hyper",
        "reqwest",
        "yamux",
        "tracing",
        "nix",
        "libc",
        "rand",
        "gpum-platform\"",
        "gpum-host",
    ] {
        assert!(!deps.contains(io), "the core depends on {io}");
    }
    // The wire types come without their `tunnel` feature (tokio and yamux).
    assert!(!deps.contains("features"), "the core turns on no feature of its dependencies");
}

#[test]
fn the_core_does_no_io() {
    let mut checked = 0;
    let mut dirs = vec![root().join("src")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { dirs.push(path) } else { files.push(path) }
        }
    }
    for path in files {
        let src = std::fs::read_to_string(&path).unwrap();
        for banned in [
            "std::fs",
            "std::net",
            "std::process",
            "std::env",
            "std::io",
            "std::thread",
            "SystemTime::now",
            "Instant::now",
            "UNIX_EPOCH",
            "tokio",
            "rand::",
            "println!",
            "eprintln!",
            "unsafe",
        ] {
            assert!(!src.contains(banned), "{} names {banned}", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 5, "every module read ({checked})");
}
