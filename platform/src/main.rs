//! `gpum-platform`: the reference control plane. The binary only hands over to the library.

/// The static (musl) build allocates through mimalloc: musl's allocator maps and unmaps memory
/// for each of yamux's 64 KiB frames (issue 45, docs/benchmarks.md). glibc builds keep glibc's.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(gpum_platform::cli::main());
}
