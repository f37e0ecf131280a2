//! The agent's hot text: the functions a steady heartbeat runs, placed side by side at link time.
//!
//! A heartbeat comes once every few seconds. By then the code it runs has left the CPU's caches
//! and TLBs, so a heartbeat pays for every page and cache line of code it touches, not only for
//! the instructions it runs. In a plain link, the functions of one heartbeat lie scattered over
//! the agent's 5 MB of text: the ones callgrind counted in a steady heartbeat spanned 278 pages of
//! 4 KiB. `agent/hot-text.ld` (a linker script that `agent/build.rs` passes to the agent's link)
//! gathers them into one output section, `.text.hot`, ahead of the rest of the text: the same
//! functions then span about 100 pages. That took a median 0.02 ms (about 6%) off the CPU
//! time of each heartbeat, in interleaved pairs (`docs/benchmarks.md`).
//!
//! The script names each function by its mangled name without the hash suffix (`17h…E`), so it
//! still matches after a dependency, a feature or the profile changes the hash. A name that
//! would then also pull in many other monomorphisations of a generic (`Vec<T>::clone`, every
//! struct's `deserialize_struct`) would make the section larger than the code it is for: it is
//! left out (see [`script`]). `cargo xtask bench hot-text` writes the script again from a
//! callgrind run; `cargo xtask bench instructions` and the regression test report the share of
//! the heartbeat's own instructions that ran inside `.text.hot`, which says when it is stale.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::say;

/// The script, relative to the workspace root.
pub const SCRIPT: &str = "agent/hot-text.ld";

/// The output section the script makes.
pub const SECTION: &str = ".text.hot";

/// The share of the agent's own instructions per heartbeat that the regression test requires to
/// run inside [`SECTION`]. The committed script placed 86% when it was written.
pub const MIN_SHARE: f64 = 0.75;

/// A name's matches may total at most this many times the hot function's own size, or
/// [`SMALL`] bytes, before the name is left out.
const SPREAD: u64 = 2;
const SMALL: u64 = 4096;

/// The agent binary's functions (mangled name to address and size) and where `.text.hot` lies.
pub struct Layout {
    functions: HashMap<String, (u64, u64)>,
    hot: Option<Range<u64>>,
}

impl Layout {
    /// Reads the symbol table of `bin`, which must keep it (the `agent-cost` profile does).
    pub fn read(bin: &Path) -> Result<Layout> {
        let data = std::fs::read(bin).with_context(|| format!("read {}", bin.display()))?;
        let file = object::File::parse(&*data).with_context(|| format!("parse {}", bin.display()))?;
        let hot = hot_range(&file);
        let mut functions = HashMap::new();
        for sym in file.symbols() {
            if sym.kind() != SymbolKind::Text || sym.size() == 0 {
                continue;
            }
            if let Ok(name) = sym.name() {
                functions.entry(name.to_owned()).or_insert((sym.address(), sym.size()));
            }
        }
        Ok(Layout { functions, hot })
    }

    /// Bytes of `.text.hot` (0 when the binary has none).
    pub fn hot_bytes(&self) -> u64 {
        self.hot.as_ref().map(|r| r.end - r.start).unwrap_or(0)
    }
}

fn hot_range(file: &object::File) -> Option<Range<u64>> {
    file.section_by_name(SECTION).map(|s| s.address()..s.address() + s.size())
}

/// The size of `.text.hot` in the ELF file `data` (0 when it has none): `cargo xtask dist`
/// refuses an agent whose link lost the script.
pub fn section_bytes(data: &[u8]) -> Result<u64> {
    let file = object::File::parse(data).context("not an object file")?;
    Ok(hot_range(&file).map(|r| r.end - r.start).unwrap_or(0))
}

/// How much of a heartbeat ran inside `.text.hot`.
#[derive(Debug, Clone, Copy)]
pub struct Locality {
    /// Of the instructions per heartbeat in the agent's own functions (Rust symbols of its
    /// binary; not libc's), the share that ran in functions inside `.text.hot`.
    pub share: f64,
    pub hot_bytes: u64,
}

/// `costs`: instructions per heartbeat by mangled function name (self cost).
pub fn locality(costs: &[(String, f64)], layout: &Layout) -> Locality {
    let (mut all, mut inside) = (0.0, 0.0);
    for (name, n) in costs {
        let Some(&(addr, _)) = layout.functions.get(name) else { continue };
        all += n;
        if layout.hot.as_ref().is_some_and(|r| r.contains(&addr)) {
            inside += n;
        }
    }
    Locality { share: if all > 0.0 { inside / all } else { 0.0 }, hot_bytes: layout.hot_bytes() }
}

/// The prefix that names `mangled` whatever its hash: a legacy Rust symbol
/// (`_ZN…17h<16 hex digits>E`) loses its hash, any other name the `.llvm.<digits>` that LLVM
/// appends to a local symbol it promotes (a number that changes with each build); the rest is
/// kept whole.
pub fn prefix(mangled: &str) -> &str {
    if let Some(at) = mangled.rfind("17h") {
        let hash = &mangled[at + 3..];
        let hex = hash.strip_suffix('E').or_else(|| hash.split_once("E.").map(|x| x.0));
        if mangled.starts_with("_ZN")
            && hex.is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return &mangled[..at + 3];
        }
    }
    match mangled.rsplit_once(".llvm.") {
        Some((name, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => mangled,
    }
}

/// The linker script for the functions in `costs` (instructions per heartbeat by mangled name),
/// costliest first, and the share of those instructions that its names cover. A name is left out
/// when the functions it would match together exceed [`SPREAD`] times the hot one's size and
/// [`SMALL`] bytes: the other instances of a generic, which a heartbeat does not run.
pub fn script(costs: &[(String, f64)], layout: &Layout) -> (String, f64) {
    let mut sorted: Vec<&(String, f64)> = costs.iter().filter(|c| c.1 > 0.0).collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let (mut all, mut covered) = (0.0, 0.0);
    let mut names: Vec<&str> = Vec::new();
    let mut decided: HashMap<&str, bool> = HashMap::new();
    for (name, n) in sorted {
        let Some(&(_, size)) = layout.functions.get(name) else { continue };
        all += n;
        let p = prefix(name);
        let keep = *decided.entry(p).or_insert_with(|| {
            let matched: u64 =
                layout.functions.iter().filter(|(f, _)| f.starts_with(p)).map(|(_, v)| v.1).sum();
            let keep = matched <= (SPREAD * size).max(SMALL);
            if keep {
                names.push(p);
            }
            keep
        });
        if keep {
            covered += n;
        }
    }
    let mut s = String::from(
        "/* The functions of a steady heartbeat, gathered ahead of the rest of the agent's text so\n   \
         that a heartbeat touches few pages of code (xtask/src/bench/hot.rs). Written by\n   \
         `cargo xtask bench hot-text`; agent/build.rs passes it to the agent's link. */\n\
         SECTIONS {\n  .text.hot : {\n",
    );
    let mut seen = HashSet::new();
    for p in names {
        if seen.insert(p) {
            s.push_str(&format!("    *(.text.{p}*)\n"));
        }
    }
    s.push_str("  }\n}\nINSERT BEFORE .text;\n");
    (s, if all > 0.0 { covered / all } else { 0.0 })
}

fn script_path() -> PathBuf {
    crate::util::workspace_root().join(SCRIPT)
}

/// `cargo xtask bench hot-text`: measures the agent under callgrind, then writes
/// [`SCRIPT`] from the functions of its steady heartbeat. Rebuild and measure again to see the
/// new layout's share.
pub fn run(_quick: bool) -> Result<Vec<super::Row>> {
    use super::Row;
    crate::util::cargo(super::cost::BUILD_ARGS)?;
    let agent = super::cost::agent_cost_bin();
    let platform =
        crate::util::release_build(&["--locked", "-p", "gpum-platform", "--bin", "gpum-platform"])?
            .join("gpum-platform");
    let c = super::cost::measure(&agent, &platform, crate::util::docker_answers())?;
    super::cost::print(&c);
    let layout = Layout::read(&agent)?;
    let (text, covered) = script(&c.self_costs, &layout);
    let path = script_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, &text).with_context(|| format!("write {}", path.display()))?;
    say!(
        "{SCRIPT}: {} names, covering {:.1}% of the agent's own instructions per heartbeat; {}",
        text.lines().filter(|l| l.trim_start().starts_with("*(")).count(),
        covered * 100.0,
        if old == text { "unchanged" } else { "written (rebuild the agent to use it)" }
    );
    Ok(vec![
        Row::info("hot text: share of the heartbeat, this build", c.locality.share * 100.0, "%"),
        Row::info("hot text: share the new script covers", covered * 100.0, "%"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary has no `.text.hot`; renamed in place (same length, so the string table's
    /// offsets stay), its `.rela.dyn` is found as one, with that section's size.
    #[test]
    fn the_dist_gate_finds_the_hot_section_by_name() {
        let mut exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(section_bytes(&exe).unwrap(), 0);
        let file = object::File::parse(&*exe).unwrap();
        let rela = file.section_by_name(".rela.dyn").expect("a PIE test binary has .rela.dyn").size();
        assert!(rela > 0);
        let (start, len) = file.section_by_name(".shstrtab").unwrap().file_range().unwrap();
        drop(file);
        let names = &mut exe[start as usize..(start + len) as usize];
        let at = names.windows(10).position(|w| w == b".rela.dyn\0").unwrap();
        names[at..at + 9].copy_from_slice(SECTION.as_bytes());
        assert_eq!(section_bytes(&exe).unwrap(), rela);
        assert!(section_bytes(b"not an ELF file").is_err());
    }

    fn layout(f: &[(&str, u64, u64)], hot: Option<Range<u64>>) -> Layout {
        Layout { functions: f.iter().map(|(n, a, s)| (n.to_string(), (*a, *s))).collect(), hot }
    }

    #[test]
    fn a_name_loses_only_what_changes_between_builds() {
        assert_eq!(
            prefix("_ZN10serde_json3ser18format_escaped_str17hb119900834f6210bE"),
            "_ZN10serde_json3ser18format_escaped_str17h"
        );
        assert_eq!(prefix("_ZN3foo3bar17h0123456789abcdefE.llvm.42"), "_ZN3foo3bar17h");
        // Not a hash: kept whole.
        assert_eq!(prefix("_ZN3foo17hello"), "_ZN3foo17hello");
        assert_eq!(prefix("_RNvNtCs1234_4core3str9from_utf8"), "_RNvNtCs1234_4core3str9from_utf8");
        // A promoted local symbol's number changes with each build: dropped.
        assert_eq!(prefix("_RNvCs1234_3std3now.llvm.3643936799275306673"), "_RNvCs1234_3std3now");
        assert_eq!(prefix("_RNvCs1234_3std3now.llvm.x1"), "_RNvCs1234_3std3now.llvm.x1");
        assert_eq!(prefix("malloc"), "malloc");
    }

    #[test]
    fn a_name_that_would_pull_in_a_generics_other_instances_is_left_out() {
        let l = layout(
            &[
                ("_ZN1a4beat17h0000000000000001E", 0x1000, 300),
                // One hot instance of a generic among many large cold ones.
                ("_ZN1b5clone17h0000000000000002E", 0x2000, 200),
                ("_ZN1b5clone17h0000000000000003E", 0x3000, 9000),
                ("_ZN1b5clone17h0000000000000004E", 0x6000, 9000),
                // A generic with two small instances: both fit.
                ("_ZN1c4poll17h0000000000000005E", 0x9000, 100),
                ("_ZN1c4poll17h0000000000000006E", 0x9100, 100),
            ],
            None,
        );
        let costs = vec![
            ("_ZN1a4beat17h0000000000000001E".to_owned(), 600.0),
            ("_ZN1b5clone17h0000000000000002E".to_owned(), 300.0),
            ("_ZN1c4poll17h0000000000000005E".to_owned(), 100.0),
            ("malloc".to_owned(), 5000.0),
        ];
        let (s, covered) = script(&costs, &l);
        assert!(s.contains("*(.text._ZN1a4beat17h*)"), "{s}");
        assert!(s.contains("*(.text._ZN1c4poll17h*)"), "{s}");
        assert!(!s.contains("clone"), "{s}");
        assert!(s.trim_end().ends_with("INSERT BEFORE .text;"), "{s}");
        assert!((covered - 0.7).abs() < 1e-9, "{covered}");
    }

    #[test]
    fn the_share_counts_only_the_agents_own_functions() {
        let l = layout(
            &[
                ("_ZN1a4beat17h0000000000000001E", 0x1000, 300),
                ("_ZN1d4cold17h0000000000000007E", 0x8000, 300),
            ],
            Some(0x1000..0x2000),
        );
        let costs = vec![
            ("_ZN1a4beat17h0000000000000001E".to_owned(), 900.0),
            ("_ZN1d4cold17h0000000000000007E".to_owned(), 100.0),
            ("malloc".to_owned(), 5000.0),
        ];
        let loc = locality(&costs, &l);
        assert!((loc.share - 0.9).abs() < 1e-9, "{}", loc.share);
        assert_eq!(loc.hot_bytes, 0x1000);
        assert_eq!(locality(&costs, &layout(&[], None)).share, 0.0);
    }
}
