//! The `apt_sources` check: existing apt entries that would clash with the sources the plan adds.
//!
//! It lives here, not in gpum-preflight, because only the installer adds apt sources (the agent
//! never runs apt), and the detector is the trust crate's ([`gpum_repo_keys::sources::conflicts`]).

use std::path::PathBuf;

use gpum_common::Lang;
use gpum_preflight::Finding;
use gpum_repo_keys::pinned::Repo;
use gpum_repo_keys::sources;

use crate::plan::{Plan, Step};

pub const APT_SOURCES: &str = "apt_sources";

/// The repositories the plan adds.
pub fn planned_repos(plan: &Plan, all: &[Repo]) -> Vec<Repo> {
    all.iter()
        .filter(|r| {
            plan.steps
                .iter()
                .any(|s| matches!(s, Step::AddRepository { id, uri, .. } if id == r.id && uri == r.uri))
        })
        .copied()
        .collect()
}

/// Fails when apt would refuse to work after gpum's sources are written (a conflicting
/// `Signed-By`), warns about duplicates, passes otherwise.
pub fn check(files: &[(PathBuf, String)], repos: &[Repo], lang: Lang) -> Finding {
    let ru = lang == Lang::Ru;
    let found: Vec<_> = repos.iter().flat_map(|r| sources::conflicts(files, r)).collect();
    let list = found.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("; ");
    if found.iter().any(|c| c.is_fatal()) {
        let files: Vec<String> =
            found.iter().filter(|c| c.is_fatal()).map(|c| c.file.display().to_string()).collect();
        let files = files.join(" ");
        Finding::fail(
            APT_SOURCES,
            if ru {
                format!(
                    "существующие источники apt конфликтуют с теми, что добавит установщик (apt перестанет работать): {list}"
                )
            } else {
                format!(
                    "existing apt sources clash with the ones the installer adds (apt would stop working): {list}"
                )
            },
            Some(if ru {
                format!("уберите эти записи (например, sudo rm {files}) и запустите установщик снова")
            } else {
                format!("remove those entries (for example sudo rm {files}) and run the installer again")
            }),
        )
    } else if !found.is_empty() {
        Finding::warn(
            APT_SOURCES,
            if ru {
                format!("репозиторий уже подключён в другом файле: {list}")
            } else {
                format!("a repository is already configured elsewhere: {list}")
            },
            Some(if ru {
                "лишние записи можно удалить".into()
            } else {
                "the extra entries can be removed".into()
            }),
        )
    } else if repos.is_empty() {
        Finding::pass(
            APT_SOURCES,
            if ru {
                "новые репозитории не нужны".into()
            } else {
                "no repository needs to be added".into()
            },
        )
    } else {
        let ids = repos.iter().map(|r| r.id).collect::<Vec<_>>().join(", ");
        Finding::pass(
            APT_SOURCES,
            if ru {
                format!("нет конфликтов с добавляемыми репозиториями ({ids})")
            } else {
                format!("no clash with the repositories to add ({ids})")
            },
        )
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
