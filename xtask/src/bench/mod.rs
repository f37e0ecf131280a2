//! Benchmarks. Each reports medians or ratios, with the command that produced them.

mod agent;
mod dryrun;
mod platform;
mod verify;

use anyhow::{Result, bail};

pub fn run(which: &str, quick: bool) -> Result<()> {
    let all = which == "all";
    let mut ran = false;
    for (name, f) in BENCHES {
        if all || which == *name {
            println!("== bench {name} ==");
            f(quick)?;
            ran = true;
        }
    }
    if !ran {
        bail!(
            "unknown bench {which}; one of: all, {}",
            BENCHES.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

type BenchFn = fn(bool) -> Result<()>;

const BENCHES: &[(&str, BenchFn)] =
    &[("agent", agent::run), ("dryrun", dryrun::run), ("platform", platform::run), ("verify", verify::run)];
