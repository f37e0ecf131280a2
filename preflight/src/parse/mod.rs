//! Pure parsers of what the machine says about itself.
//!
//! Each takes text (a file's contents or a command's output) and returns plain data, so it is
//! tested on captured real samples in `tests/fixtures/preflight/` without touching the machine.

pub mod docker;
pub mod dpkg;
pub mod mountinfo;
pub mod os_release;
pub mod systemctl;
pub mod toolkit_config;

#[cfg(test)]
pub(crate) fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/preflight").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
