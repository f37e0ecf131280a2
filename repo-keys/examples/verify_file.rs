//! `verify_file FILE KEY [--repeat N]`: verifies FILE against the signed `manifest.json` beside
//! it (with `manifest.json.sig`) and the release key KEY, the way the installer does (the
//! manifest's signature, then one SHA-256 pass over the data). It exists for
//! `cargo xtask bench verify`, which compares it with `sha256sum` on the same file; with
//! `--repeat N` it also prints the in-process median time in microseconds.
#![allow(clippy::disallowed_methods)]

use std::time::{Instant, SystemTime};

use gpum_repo_keys::release::{MANIFEST, MANIFEST_SIG, ReleaseKeys, Wanted, verify_manifest};
use sequoia_openpgp::parse::Parse;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (file, key) = (&args[1], &args[2]);
    let repeat: usize =
        args.iter().position(|a| a == "--repeat").map(|i| args[i + 1].parse().unwrap()).unwrap_or(1);
    let pubkey = std::fs::read(key).expect("key");
    let fpr = sequoia_openpgp::Cert::from_bytes(&pubkey).expect("cert").fingerprint().to_hex();
    let keys = ReleaseKeys::new(&pubkey, &[&fpr]).expect("keys");
    let name = std::path::Path::new(file).file_name().unwrap().to_string_lossy().into_owned();
    let mut times = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        let dir = std::path::Path::new(file).parent().unwrap();
        let manifest = std::fs::read(dir.join(MANIFEST)).expect("manifest");
        let sig = std::fs::read(dir.join(MANIFEST_SIG)).expect("manifest signature");
        let wanted = Wanted { name: &name, installed_version: None, allow_downgrade: false };
        let signed = match verify_manifest(&manifest, &sig, &keys, SystemTime::now()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("FAILED: {e}");
                std::process::exit(20);
            }
        };
        let mut v = signed.verifier(&wanted).expect("listed");
        // Read in 64 KiB chunks, as a download arrives, rather than all at once.
        let mut f = std::fs::File::open(file).expect("open");
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = std::io::Read::read(&mut f, &mut buf).expect("read");
            if n == 0 {
                break;
            }
            v.update(&buf[..n]).expect("within the signed size");
        }
        if let Err(e) = v.finish() {
            eprintln!("FAILED: {e}");
            std::process::exit(20);
        }
        times.push(t.elapsed().as_micros());
    }
    if repeat > 1 {
        times.sort();
        println!("{}", times[times.len() / 2]);
    }
}
