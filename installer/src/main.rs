//! `gpum-install`: see the library docs and docs/install.md.

use std::io::Write;

use gpum_host::RealHost;
use gpum_install::{Io, run};
use gpum_preflight::gpu::NvmlProbe;

fn main() {
    // Arguments that are not UTF-8 cannot be gpum's; lossily converted, they fail as unknown.
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let code = run(
        std::sync::Arc::new(RealHost::new()),
        &NvmlProbe,
        &args,
        &mut Io { stdin: &mut std::io::stdin(), stdout: &mut out, stderr: &mut std::io::stderr() },
    );
    let _ = out.flush();
    drop(out);
    std::process::exit(code);
}
