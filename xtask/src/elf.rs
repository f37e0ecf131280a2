//! The portability gate of `cargo xtask dist`: what a shipped binary asks of the machine it
//! runs on, read from its ELF headers (the `object` crate; no `objdump` to install or parse).
//!
//! - A glibc binary (`gpum-install`, `gpum-agent`: they `dlopen` NVML, so they cannot be static)
//!   may need only libraries from [`GLIBC_LIBS`], and no symbol version newer than [`GLIBC_MAX`]
//!   (Ubuntu 22.04's glibc, the oldest supported host). A binary linked on a newer distribution
//!   picks up newer versions silently (`GLIBC_2.36`, ...), and then fails to start on 22.04 with
//!   "version `GLIBC_2.36' not found": this gate fails the build instead.
//! - A static binary (`gpum-platform`, musl) needs no library and no interpreter at all.

use anyhow::{Context, Result, bail};
use object::elf;
use object::read::elf::{Dyn, ElfFile64, ProgramHeader};

/// The newest glibc symbol version a shipped binary may need (Ubuntu 22.04).
pub const GLIBC_MAX: [u32; 2] = [2, 35];

/// The libraries a glibc binary may link: glibc's own, and the unwinder gcc links in.
pub const GLIBC_LIBS: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
];

/// What a binary asks of the dynamic loader.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// `DT_NEEDED`: the shared libraries, in order.
    pub libraries: Vec<String>,
    /// `PT_INTERP`: the program interpreter, if any.
    pub interpreter: Option<String>,
    /// `SHT_GNU_VERNEED`: (library, version) pairs, e.g. ("libc.so.6", "GLIBC_2.34").
    pub versions: Vec<(String, String)>,
}

/// Reads the dynamic needs of a 64-bit ELF file.
pub fn needs(data: &[u8]) -> Result<Needs> {
    let file = ElfFile64::<object::Endianness>::parse(data).context("not a 64-bit ELF file")?;
    let endian = file.endian();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut n = Needs::default();
    for ph in file.elf_program_headers() {
        if ph.p_type(endian) == elf::PT_INTERP {
            let raw = ph.data(endian, data).ok().context("unreadable PT_INTERP")?;
            n.interpreter = Some(text(raw.split(|&b| b == 0).next().unwrap_or_default()));
        }
    }
    let sections = file.elf_section_table();
    if let Some((dyns, link)) = sections.dynamic(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        for d in dyns {
            if d.tag32(endian) == Some(elf::DT_NEEDED) {
                n.libraries.push(text(d.string(endian, strings)?));
            }
        }
    }
    if let Some((mut iter, link)) = sections.gnu_verneed(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((need, mut auxs)) = iter.next()? {
            let lib = text(need.file(endian, strings)?);
            while let Some(aux) = auxs.next()? {
                n.versions.push((lib.clone(), text(aux.name(endian, strings)?)));
            }
        }
    }
    Ok(n)
}

/// `GLIBC_2.35` -> `[2, 35]`; `None` for anything else (`GLIBC_PRIVATE`, `GCC_3.0`).
fn glibc_version(v: &str) -> Option<Vec<u32>> {
    v.strip_prefix("GLIBC_")?.split('.').map(|p| p.parse().ok()).collect()
}

/// Why a glibc binary would not run on every supported host (empty: it would).
pub fn glibc_problems(n: &Needs) -> Vec<String> {
    let mut why = Vec::new();
    for lib in &n.libraries {
        if !GLIBC_LIBS.contains(&lib.as_str()) {
            why.push(format!("links {lib}, which is not part of glibc"));
        }
    }
    let max = format!("GLIBC_{}.{}", GLIBC_MAX[0], GLIBC_MAX[1]);
    for (lib, v) in &n.versions {
        if v.starts_with("GLIBC_") {
            match glibc_version(v) {
                Some(ver) if ver.as_slice() <= GLIBC_MAX.as_slice() => {}
                Some(_) => why.push(format!("needs {v} from {lib}, newer than {max}")),
                None => why.push(format!("needs {v} from {lib}, not a released glibc version")),
            }
        }
    }
    why
}

/// Why a binary is not fully static (empty: it is).
pub fn static_problems(n: &Needs) -> Vec<String> {
    let mut why: Vec<String> = n.libraries.iter().map(|l| format!("links {l}")).collect();
    if let Some(i) = &n.interpreter {
        why.push(format!("asks for the interpreter {i}"));
    }
    why
}

/// Checks one shipped binary; `static_` for the musl one.
pub fn check(name: &str, data: &[u8], static_: bool) -> Result<()> {
    let n = needs(data).with_context(|| format!("reading {name}"))?;
    let why = if static_ { static_problems(&n) } else { glibc_problems(&n) };
    if !why.is_empty() {
        bail!("{name} would not run on every supported host:\n  {}", why.join("\n  "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replaces every occurrence of `from` by `to` (same length: string table offsets stay).
    fn patch(data: &mut [u8], from: &[u8], to: &[u8]) -> usize {
        assert_eq!(from.len(), to.len());
        let mut hits = 0;
        let mut i = 0;
        while i + from.len() <= data.len() {
            if &data[i..i + from.len()] == from {
                data[i..i + from.len()].copy_from_slice(to);
                hits += 1;
                i += from.len();
            } else {
                i += 1;
            }
        }
        hits
    }

    /// This test binary is a real glibc executable: the parser finds libc, its interpreter and
    /// glibc's baseline version. The same bytes, with a newer version and a foreign library
    /// written into the string table, fail the gate, naming both.
    #[test]
    fn reads_a_real_binary_and_refuses_a_crafted_one() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let n = needs(&exe).unwrap();
        assert!(n.libraries.iter().any(|l| l == "libc.so.6"), "{n:?}");
        assert_eq!(n.interpreter.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
        assert!(n.versions.iter().any(|(l, v)| l == "libc.so.6" && v == "GLIBC_2.2.5"), "{n:?}");
        assert!(static_problems(&n).iter().any(|w| w.contains("ld-linux")));

        let mut crafted = exe.clone();
        assert!(patch(&mut crafted, b"GLIBC_2.2.5\0", b"GLIBC_2.99\0\0") > 0);
        assert!(patch(&mut crafted, b"libgcc_s.so.1\0", b"libzzz_s.so.1\0") > 0);
        let why = glibc_problems(&needs(&crafted).unwrap());
        assert!(
            why.iter().any(|w| w.contains("GLIBC_2.99") && w.contains("newer than GLIBC_2.35")),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.contains("links libzzz_s.so.1")), "{why:?}");
        assert!(check("crafted", &crafted, false).is_err());
    }

    #[test]
    fn versions_compare_as_numbers() {
        let n = |v: &str| Needs { versions: vec![("libc.so.6".into(), v.into())], ..Needs::default() };
        assert!(glibc_problems(&n("GLIBC_2.35")).is_empty());
        assert!(glibc_problems(&n("GLIBC_2.3.4")).is_empty());
        assert!(glibc_problems(&n("GCC_3.0")).is_empty());
        assert_eq!(glibc_problems(&n("GLIBC_2.36")).len(), 1);
        assert_eq!(glibc_problems(&n("GLIBC_3.0")).len(), 1);
        assert_eq!(glibc_problems(&n("GLIBC_PRIVATE")).len(), 1);
        assert!(needs(b"#!/bin/sh\n").is_err());
    }

    /// The binaries `cargo xtask dist` built, which `GPUM_DIST_DIR` names (`cargo xtask test`
    /// sets it and runs this test).
    #[test]
    #[ignore = "needs cargo xtask dist's output"]
    fn dist_binaries_pass_the_gate() {
        let dir = crate::dist::require_dist("dist_binaries_pass_the_gate");
        for (name, target) in crate::dist::BINARIES {
            let data = std::fs::read(dir.join(name)).unwrap();
            check(name, &data, target == crate::dist::MUSL).unwrap();
            let n = needs(&data).unwrap();
            if target == crate::dist::MUSL {
                assert!(n.libraries.is_empty() && n.interpreter.is_none(), "{name}: {n:?}");
            } else {
                assert!(n.libraries.iter().any(|l| l == "libc.so.6"), "{name}: {n:?}");
            }
        }
    }
}
