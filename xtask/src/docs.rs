//! `cargo xtask docs`: writes the generated parts of the documentation.
//!
//! Today that is the table of messages and exit codes in the owner's guides, made by
//! `gpum_common::guide::exit_code_table` from `Failure` and the exit codes. `--check` changes
//! nothing and fails when a guide is out of date (`tests/e2e/guides.rs` checks the same).

use anyhow::{Context, Result, bail};
use gpum_common::{Lang, guide};

use crate::util::workspace_root;

/// The guides that carry the table, with their language.
pub const GUIDES: &[(&str, Lang)] =
    &[("docs/owner-guide.ru.md", Lang::Ru), ("docs/owner-guide.en.md", Lang::En)];

pub fn run(check: bool) -> Result<()> {
    let mut stale = Vec::new();
    for (rel, lang) in GUIDES {
        let path = workspace_root().join(rel);
        let doc = std::fs::read_to_string(&path).with_context(|| format!("read {rel}"))?;
        let Some(new) = guide::splice(&doc, &guide::exit_code_table(*lang)) else {
            bail!("{rel}: no `{}` … `{}` lines to put the table between", guide::BEGIN, guide::END);
        };
        if new == doc {
            eprintln!("xtask: {rel} is up to date");
        } else if check {
            stale.push(*rel);
        } else {
            std::fs::write(&path, new).with_context(|| format!("write {rel}"))?;
            eprintln!("xtask: {rel} rewritten");
        }
    }
    if !stale.is_empty() {
        bail!("out of date: {} (run `cargo xtask docs`)", stale.join(", "));
    }
    Ok(())
}
