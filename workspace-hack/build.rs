// A build script, so that cargo considers the `[build-dependencies]` hakari lists.
fn main() {}
