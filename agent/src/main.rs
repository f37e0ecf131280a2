//! The `gpum-agent` binary: everything is in the library (`gpum_agent::cli`).

fn main() {
    std::process::exit(gpum_agent::cli::main());
}
