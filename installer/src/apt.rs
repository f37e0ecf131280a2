//! The `apt_sources` check: existing apt entries that would clash with the sources the plan adds.
//!
//! It lives here, not in gpum-preflight, because only the installer adds apt sources (the agent
//! never runs apt), and the detector is the trust crate's ([`gpum_repo_keys::sources::conflicts`]).

use std::path::PathBuf;

use gpum_common::Lang;
use gpum_common::texts::fill;
use gpum_host::Host;
use gpum_preflight::Finding;
use gpum_repo_keys::pinned::Repo;
use gpum_repo_keys::sources::{self, OwnerSource};

use crate::plan::{Plan, Step};
use crate::text::{Msg, t};

pub const APT_SOURCES: &str = "apt_sources";

/// The repositories the plan adds.
pub fn planned_repos(plan: &Plan, all: &[Repo]) -> Vec<Repo> {
    all.iter()
        .filter(|r| {
            plan.steps
                .iter()
                .any(|s| matches!(s, Step::AddRepository(a) if a.repo.id == r.id && a.repo.uri == r.uri))
        })
        .copied()
        .collect()
}

/// The owner's sources ([`sources::owner_source`]) for the repositories among `repos` that
/// `plan` adds: each one an entry (Docker's or NVIDIA's own instructions) whose keyring holds
/// exactly the pinned key, so the install can use it instead of adding its own. A repository
/// without one stays in the plan and meets [`check`].
pub fn owner_sources(
    host: &dyn Host,
    files: &[(PathBuf, String)],
    repos: &[Repo],
    plan: &Plan,
) -> Vec<(&'static str, OwnerSource)> {
    let arch = host.arch();
    let arch = sources::dpkg_arch(&arch);
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::AddRepository(a) if repos.contains(&a.repo) => {
                sources::owner_source(host, files, &a.repo, a.suite(), arch, host.now())
                    .map(|src| (a.repo.id, src))
            }
            _ => None,
        })
        .collect()
}

/// Fails when apt would refuse to work after gpum's sources are written (a conflicting
/// `Signed-By`), warns about duplicates, passes otherwise.
pub fn check(files: &[(PathBuf, String)], repos: &[Repo], lang: Lang) -> Finding {
    let found: Vec<_> = repos.iter().flat_map(|r| sources::conflicts(files, r)).collect();
    let list = found.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("; ");
    if found.iter().any(|c| c.is_fatal()) {
        let files: Vec<String> =
            found.iter().filter(|c| c.is_fatal()).map(|c| c.file.display().to_string()).collect();
        let files = files.join(" ");
        Finding::fail(
            APT_SOURCES,
            fill(t(Msg::AptSourcesClash, lang), &[("list", &list)]),
            Some(fill(t(Msg::AptSourcesClashFix, lang), &[("files", &files)])),
        )
    } else if !found.is_empty() {
        Finding::warn(
            APT_SOURCES,
            fill(t(Msg::AptSourcesElsewhere, lang), &[("list", &list)]),
            Some(t(Msg::AptSourcesElsewhereFix, lang).into()),
        )
    } else if repos.is_empty() {
        Finding::pass(APT_SOURCES, t(Msg::AptSourcesNoneToAdd, lang).into())
    } else {
        let ids = repos.iter().map(|r| r.id).collect::<Vec<_>>().join(", ");
        Finding::pass(APT_SOURCES, fill(t(Msg::AptSourcesNoClash, lang), &[("ids", &ids)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_preflight::Status;
    use gpum_repo_keys::pinned::{DOCKER_UBUNTU, NVIDIA_TOOLKIT};

    fn f(p: &str, t: &str) -> (PathBuf, String) {
        (PathBuf::from(p), t.to_string())
    }

    #[test]
    fn a_get_docker_com_list_with_another_keyring_fails() {
        let files = [f(
            "/etc/apt/sources.list.d/docker.list",
            "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu jammy stable\n",
        )];
        let x = check(&files, &[DOCKER_UBUNTU, NVIDIA_TOOLKIT], Lang::En);
        assert_eq!(x.status, Status::Fail);
        assert!(x.fix.unwrap().contains("/etc/apt/sources.list.d/docker.list"));
        // Not adding Docker's repository: that entry is no business of gpum's.
        assert_eq!(check(&files, &[NVIDIA_TOOLKIT], Lang::En).status, Status::Pass);
        assert_eq!(check(&files, &[], Lang::Ru).status, Status::Pass);
    }
}
