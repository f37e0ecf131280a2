//! Feeds arbitrary bytes to every parser and verifier of the trust chain that reads data from
//! the network: downloaded apt keys, release keyrings, `.sha256` and `.sig` files, `InRelease`
//! files, and apt source lists. None may panic, hang or accept: the inputs are random, so any
//! success other than on a valid key copy would be a verification bug.
#![no_main]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use gpum_repo_keys::{inrelease, keys, pinned, release, sources};
use libfuzzer_sys::fuzz_target;

const DEBIAN_KEYRING: &[u8] = include_bytes!("../../repo-keys/tests/fixtures/debian-archive-keyring.gpg");

fuzz_target!(|data: &[u8]| {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_083_200);
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 5 {
        0 => {
            if let Ok(k) = keys::verify_key(rest, pinned::DOCKER_UBUNTU.fingerprints, now) {
                assert_eq!(k.fingerprint, pinned::DOCKER_UBUNTU.fingerprints[0]);
            }
        }
        1 => {
            let _ = release::ReleaseKeys::new(rest, release::GPUM_RELEASE_FINGERPRINTS);
        }
        2 => {
            // The checksum of the payload, so the signature path is reached.
            let sum = "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5  f\n";
            let sig = rest;
            if let Ok(mut v) = release::ArtifactVerifier::new(sum.as_bytes(), sig, "f") {
                v.update(b"payload");
                assert!(v.finish(&release::ReleaseKeys::gpum(), now).is_err());
            }
            let _ = release::parse_sha256_file(rest, "f");
        }
        3 => {
            let _ = inrelease::verify_inrelease(rest, DEBIAN_KEYRING, now);
        }
        _ => {
            let text = String::from_utf8_lossy(rest).into_owned();
            let files = [
                (PathBuf::from("/etc/apt/sources.list.d/x.list"), text.clone()),
                (PathBuf::from("/etc/apt/sources.list.d/x.sources"), text),
            ];
            let _ = sources::conflicts(&files, &pinned::DOCKER_UBUNTU);
        }
    }
});
