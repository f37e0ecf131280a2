//! `cargo xtask bench sizes`: the size of each binary that `cargo xtask dist` ships (the
//! `release-small` profile, stripped), against its budget ([`dist::SIZE_BUDGET`] for the two
//! glibc binaries, which owners download on every install), with the same binary from the plain
//! `release` profile of the same tree as the reference. Sizes are counts, not times: they do not
//! move with the machine, so one build is the measurement (`--quick` changes nothing).

use anyhow::{Context, Result};

use super::{Row, say};
use crate::dist;
use crate::util::{release_build, workspace_root};

const MIB: f64 = 1024.0 * 1024.0;

pub fn run(_quick: bool) -> Result<Vec<Row>> {
    let root = std::fs::canonicalize(workspace_root())?;
    let target = std::path::absolute(crate::util::target_dir())?;
    let epoch = dist::source_date_epoch(&root)?;
    let shipped = dist::build(&root, &target, &epoch)?;
    let release = release_build(&["-p", "gpum-install", "-p", "gpum-agent", "-p", "gpum-platform"])?;

    let mut rows = Vec::new();
    for ((name, path), (_, triple)) in shipped.iter().zip(dist::BINARIES) {
        let size = len(path)?;
        let reference = len(&release.join(name))?;
        say!(
            "{name:<14} {size:>10} bytes ({triple}, {}); {reference:>10} bytes with the release profile",
            dist::PROFILE
        );
        let row = if triple == dist::GNU {
            Row::at_most(
                &format!("{name} size"),
                size as f64 / MIB,
                "MiB",
                dist::SIZE_BUDGET as f64 / MIB,
                true,
            )
        } else {
            // The static platform is the operator's, downloaded once; it has no budget.
            Row::info(&format!("{name} size (static)"), size as f64 / MIB, "MiB")
        };
        rows.push(row.with_reference(format!("release profile {:.2} MiB (glibc)", reference as f64 / MIB)));
    }
    Ok(rows)
}

fn len(p: &std::path::Path) -> Result<u64> {
    Ok(std::fs::metadata(p).with_context(|| format!("{}", p.display()))?.len())
}
