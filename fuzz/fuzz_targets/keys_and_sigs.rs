//! Feeds arbitrary bytes to every parser and verifier of the trust chain that reads data from
//! the network: downloaded apt keys, release keyrings, the release manifest and its signature,
//! the release metadata (`release.json`) and its signature,
//! `InRelease` files, apt source lists, and the version rule. None may panic, hang or accept a
//! signature: the inputs are random, so any success other than on a valid key copy would be a
//! verification bug.
#![no_main]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use gpum_repo_keys::{inrelease, keys, pinned, release, sources};
use libfuzzer_sys::fuzz_target;

const DEBIAN_KEYRING: &[u8] = include_bytes!("../../repo-keys/tests/fixtures/debian-archive-keyring.gpg");

fuzz_target!(|data: &[u8]| {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_083_200);
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 7 {
        0 => {
            if let Ok(k) = keys::verify_key(rest, pinned::DOCKER_UBUNTU.fingerprints, now) {
                assert_eq!(k.fingerprint, pinned::DOCKER_UBUNTU.fingerprints[0]);
            }
        }
        1 => {
            let _ = release::ReleaseKeys::new(rest, release::GPUM_RELEASE_FINGERPRINTS);
        }
        2 => {
            // Random bytes as the signature of a fixed manifest: never a good signature.
            let manifest = br#"{"format":1,"artifacts":[{"name":"gpum-agent","version":"0.1.0","size":7,"sha256":"239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"}]}"#;
            assert!(release::verify_manifest(manifest, rest, &release::ReleaseKeys::gpum(), now).is_err());
            // And of a fixed release.json (issue 47).
            let meta = br#"{"format":1,"version":"0.1.0","expires":1900000000,"manifest_sha256":"239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"}"#;
            assert!(release::verify_release(&release::ReleaseKeys::gpum(), meta, rest, 1_796_083_200).is_err());
            let _ = release::parse_signatures(rest);
        }
        3 => {
            let _ = inrelease::verify_inrelease(rest, DEBIAN_KEYRING, now);
        }
        5 => {
            // The manifest parser (the verifier runs it only on signed bytes, but a signer's
            // mistake must not crash an installer either). What it accepts keeps its rules.
            if let Ok(m) = release::Manifest::parse(rest) {
                assert_eq!(m.format, release::MANIFEST_FORMAT);
                for e in &m.artifacts {
                    assert_eq!(m.entry(&e.name).unwrap(), e, "names are unique");
                    assert_eq!(e.sha256.len(), 64);
                    assert!(release::check_version(&e.version, None, false).is_ok());
                }
            }
            // The release metadata's parser (issue 47) on the same bytes: what it accepts keeps
            // its rules.
            if let Ok(m) = release::ReleaseMeta::parse(rest) {
                assert_eq!(m.format, release::RELEASE_FORMAT);
                assert_eq!(m.manifest_sha256.len(), 64);
                assert!(release::check_version(&m.version, None, false).is_ok());
                assert!(release::check_newer(&m.version, &m.version).is_err(), "never newer than itself");
            }
        }
        6 => {
            // The version rule on two arbitrary strings: it never accepts an unreadable
            // version, and of two readable ones at most one direction is a downgrade.
            let text = String::from_utf8_lossy(rest);
            let (a, b) = text.split_once('\n').unwrap_or((&text, ""));
            let ab = release::check_version(a, Some(b), false);
            let ba = release::check_version(b, Some(a), false);
            if matches!(ab, Err(release::ReleaseError::Downgrade { .. })) {
                assert!(ba.is_ok(), "{a:?} < {b:?} and {b:?} < {a:?}");
            }
            assert!(release::check_version(a, Some(b), true).is_ok() == release::check_version(a, None, false).is_ok());
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
