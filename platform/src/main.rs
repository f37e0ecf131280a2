//! `gpum-platform`: the reference control plane. The binary only hands over to the library.

fn main() {
    std::process::exit(gpum_platform::cli::main());
}
