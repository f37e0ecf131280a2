//! `gpum-agent uninstall`: removes what gpum put on the machine, and nothing else.
//!
//! What goes, in this order, per the owner's guide:
//! 1. the service: `systemctl stop` and `disable` (skipped, with a note, where systemd is not
//!    running), so that no agent recreates anything while the rest goes;
//! 2. every container labelled `gpum.managed=true`, and every probe (`gpum.probe=true` plus
//!    `gpum.probe.run`, named `gpum-probe-…`), running or stopped, the labels set on the
//!    container itself and not inherited from its image (each re-checked right before removal);
//! 3. the rentals' Docker network `gpum-rentals` (if gpum's and empty) and gpum's nftables
//!    table `inet gpum_rentals` ([`crate::egress::remove`]), and no other rule;
//! 4. the unit file, `/opt/gpum-agent` (with an upgrade's `gpum-agent.previous` and
//!    `gpum-agent.new`), `/etc/gpum-agent`, `/var/lib/gpum-agent` (with `upgrade.json`).
//!
//! What stays: Docker, the NVIDIA driver and toolkit, every image and volume, and every
//! container without those labels, or whose labels come from its image.
//!
//! Files go through [`gpum_host::Host`], so a test runs the whole uninstall against
//! `RealHost::with_root(scratch)` and the real engine (with a test-scoped Docker client) and
//! checks that decoys survive. A step that fails does not stop the others; the exit status is
//! decided once at the end, and the summary says what was removed and what was not.

use std::path::Path;

use gpum_common::agent_state::{CONFIG_DIR, DEFAULT_STATE_DIR, INSTALL_DIR, SERVICE_NAME, UNIT_PATH};
use gpum_common::text::escape_controls;
use gpum_common::texts::fill;
use gpum_common::{Failure, Lang, exit};
use gpum_host::{Cmd, Host};

use crate::docker::rental::{NETWORK, RENTAL};
use crate::docker::{Docker, DockerError, LABEL_MANAGED, MANAGED, PROBE};
use crate::egress;
use crate::text::Msg;

/// Where systemd keeps its runtime state; present exactly when systemd is PID 1.
const SYSTEMD_RUNTIME_DIR: &str = "/run/systemd/system";

/// What an uninstall did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uninstalled {
    /// Each thing removed, for humans: paths, `service gpum-agent`, `container <name>`.
    pub removed: Vec<String>,
    /// Things worth saying that are not failures.
    pub notes: Vec<String>,
    /// Steps that failed; any makes the exit status non-zero.
    pub errors: Vec<String>,
}

/// The CLI: checks root, asks unless `yes`, uninstalls, prints the summary, returns the exit
/// code. `docker` is the connection attempt to the engine.
pub async fn run(host: &dyn Host, yes: bool, docker: Result<Docker, DockerError>, lang: Lang) -> i32 {
    if host.euid() != 0 {
        return gpum_common::report(&Failure::UninstallNeedsRoot, lang);
    }
    if !yes {
        if !host.stdin_is_tty() {
            return gpum_common::report(&Failure::UninstallNotConfirmed, lang);
        }
        let prompt = Msg::UninstallPrompt.text(lang);
        // The question defaults to "no"; no terminal to ask on is no confirmation.
        match host.confirm(prompt) {
            Ok(Some(true)) => {}
            Ok(Some(false)) => {
                println!("{}", Msg::UninstallDeclined.text(lang));
                return exit::OK;
            }
            Ok(None) | Err(_) => return gpum_common::report(&Failure::UninstallNotConfirmed, lang),
        }
    }
    let done = uninstall(host, docker.as_ref().map_err(Clone::clone), lang).await;
    println!("{}", render(&done, lang));
    if done.errors.is_empty() { exit::OK } else { exit::OTHER }
}

/// Removes everything gpum owns. Never fails as a whole: see [`Uninstalled::errors`].
pub async fn uninstall(host: &dyn Host, docker: Result<&Docker, DockerError>, lang: Lang) -> Uninstalled {
    let mut u = Uninstalled::default();
    let systemd = host.is_dir(Path::new(SYSTEMD_RUNTIME_DIR));

    // 1. The service first, so that it cannot start a probe while its containers go.
    if systemd {
        let stop = systemctl(host, &["stop", SERVICE_NAME]);
        let disable = systemctl(host, &["disable", SERVICE_NAME]);
        // An upgrade's rollback guard (issue 47) must not put a binary back after this.
        crate::upgrade::stop_guard(host);
        match (stop, disable) {
            (Ok(()), Ok(())) => {
                u.removed.push(fill(Msg::UninstallServiceRemoved.text(lang), &[("name", SERVICE_NAME)]))
            }
            // A unit that was never installed cannot be stopped; that is not a failure.
            _ if !host.exists(Path::new(UNIT_PATH)) => {
                u.notes.push(Msg::UninstallNoService.text(lang).into())
            }
            (a, b) => u.errors.extend([a.err(), b.err()].into_iter().flatten()),
        }
    } else {
        u.notes.push(Msg::UninstallNoSystemd.text(lang).into());
    }

    // What step 3 needs of the engine, before step 2 takes it.
    let engine = docker.as_ref().ok().copied();
    let scoped = engine.is_some_and(Docker::is_test_scoped);

    // 2. The containers.
    match docker {
        Ok(d) => {
            // Rentals first, with their anonymous volumes (the tenant's scratch, nobody else's);
            // other managed containers keep theirs.
            for (mark, volumes) in [(RENTAL, true), (MANAGED, false), (PROBE, true)] {
                let label = mark.label;
                match d.remove_all_marked(mark, volumes).await {
                    Ok(names) => u.removed.extend(names.into_iter().map(|n| {
                        fill(Msg::UninstallContainerRemoved.text(lang), &[("name", &n), ("label", label)])
                    })),
                    Err(e) => u.errors.push(docker_left(label, &e, lang)),
                }
            }
        }
        Err(e) => u.errors.push(docker_left(LABEL_MANAGED, &e, lang)),
    }

    // 2b. What the rentals had of the machine: their network (empty now) and the egress table.
    // A test-scoped client shares both with every other test on the engine: left alone.
    match engine {
        Some(_) if scoped => u.notes.push(Msg::UninstallTestScopeKeeps.text(lang).into()),
        Some(d) => match crate::docker::rental::remove_network(d).await {
            Ok(true) => u.removed.push(fill(Msg::UninstallNetworkRemoved.text(lang), &[("name", NETWORK)])),
            Ok(false) => {}
            Err(e) => u.errors.push(format!("{NETWORK}: {e}")),
        },
        None => {}
    }
    if !scoped {
        let table = format!("{} {}", egress::FAMILY, egress::TABLE);
        match egress::remove(host) {
            Ok(true) => u.removed.push(fill(Msg::UninstallTableRemoved.text(lang), &[("table", &table)])),
            Ok(false) => {}
            Err(e) => u.errors.push(format!("nftables {table}: {e}")),
        }
    }

    // 4. The unit and the directories.
    let unit = Path::new(UNIT_PATH);
    if host.exists(unit) {
        match host.remove_file(unit) {
            Ok(()) => {
                u.removed.push(UNIT_PATH.to_string());
                if systemd && let Err(e) = systemctl(host, &["daemon-reload"]) {
                    u.errors.push(e);
                }
            }
            Err(e) => u.errors.push(format!("{UNIT_PATH}: {e}")),
        }
    }
    for dir in [INSTALL_DIR, CONFIG_DIR, DEFAULT_STATE_DIR] {
        let p = Path::new(dir);
        if !host.exists(p) {
            continue;
        }
        match host.remove_dir_all(p) {
            Ok(()) => u.removed.push(dir.to_string()),
            Err(e) => u.errors.push(format!("{dir}: {e}")),
        }
    }
    for r in &u.removed {
        tracing::info!(what = %r, "uninstall removed");
    }
    u
}

fn systemctl(host: &dyn Host, args: &[&str]) -> Result<(), String> {
    let cmd = Cmd::new("systemctl").args(args.iter().copied());
    match host.run(&cmd) {
        Ok(o) if o.success() => Ok(()),
        Ok(o) => Err(format!("{}: {}", cmd.display(), String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("{}: {e}", cmd.display())),
    }
}

fn docker_left(label: &str, e: &DockerError, lang: Lang) -> String {
    fill(Msg::UninstallContainersLeft.text(lang), &[("label", label), ("error", &e.to_string())])
}

/// The summary printed at the end.
pub fn render(u: &Uninstalled, lang: Lang) -> String {
    let mut s = String::new();
    if u.removed.is_empty() {
        s.push_str(&format!("{}\n", Msg::UninstallNothingFound.text(lang)));
    } else {
        s.push_str(&format!("{}\n", Msg::UninstallRemoved.text(lang)));
        // Container names and the engine's errors are someone else's text: escaped.
        for r in &u.removed {
            s.push_str(&format!("  - {}\n", escape_controls(r)));
        }
    }
    for n in &u.notes {
        s.push_str(&format!("{} {}\n", Msg::UninstallNote.text(lang), escape_controls(n)));
    }
    for e in &u.errors {
        s.push_str(&format!("{} {}\n", Msg::UninstallFailed.text(lang), escape_controls(e)));
    }
    s.push_str(Msg::UninstallLeftInPlace.text(lang));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::Output;
    use gpum_host::fake::FakeHost;

    fn ok() -> std::io::Result<Output> {
        Ok(Output { code: Some(0), ..Default::default() })
    }

    fn no_docker() -> Result<&'static Docker, DockerError> {
        Err(DockerError::Unavailable("socket /nonexistent not found".into()))
    }

    #[tokio::test]
    async fn with_systemd_stops_disables_and_removes_only_gpum_paths() {
        let h = FakeHost::new()
            .dir(SYSTEMD_RUNTIME_DIR)
            .file(UNIT_PATH, "[Unit]")
            .file("/etc/systemd/system/other.service", "[Unit]")
            .dir(INSTALL_DIR)
            .file("/opt/gpum-agent/gpum-agent", "bin")
            .dir(CONFIG_DIR)
            .file("/etc/gpum-agent/config.toml", "token")
            .dir(DEFAULT_STATE_DIR)
            .file("/opt/gpum-agent/gpum-agent.previous", "old bin")
            .file("/opt/gpum-agent/gpum-agent.new", "new bin")
            .file("/var/lib/gpum-agent/upgrade.json", "{}")
            .file("/opt/other/keep", "x")
            .command("systemctl stop gpum-agent", ok())
            .command("systemctl disable gpum-agent", ok())
            .command("systemctl daemon-reload", ok());
        let u = uninstall(&h, no_docker(), Lang::En).await;
        let ran: Vec<String> = h.ran().iter().map(Cmd::display).collect();
        assert_eq!(
            ran,
            [
                "systemctl stop gpum-agent",
                "systemctl disable gpum-agent",
                // An upgrade's rollback guard, best effort.
                "systemctl stop gpum-agent-rollback.timer",
                // Whether gpum's egress table is there (no nft on this fake: none is).
                "nft -j list table inet gpum_rentals",
                "systemctl daemon-reload"
            ]
        );
        assert!(!h.exists(Path::new(UNIT_PATH)) && !h.exists(Path::new("/opt/gpum-agent/gpum-agent")));
        for upgrade_file in [
            "/opt/gpum-agent/gpum-agent.previous",
            "/opt/gpum-agent/gpum-agent.new",
            "/var/lib/gpum-agent/upgrade.json",
        ] {
            assert!(!h.exists(Path::new(upgrade_file)), "{upgrade_file}");
        }
        assert!(
            !h.exists(Path::new("/etc/gpum-agent/config.toml")) && !h.exists(Path::new(DEFAULT_STATE_DIR))
        );
        assert!(
            h.exists(Path::new("/etc/systemd/system/other.service"))
                && h.exists(Path::new("/opt/other/keep"))
        );
        assert_eq!(u.removed[0], "service gpum-agent (stopped, disabled)");
        assert!(u.removed.contains(&INSTALL_DIR.to_string()));
        // Docker was unreachable: that is reported with the command to finish by hand.
        assert_eq!(u.errors.len(), 1);
        assert!(
            u.errors[0].contains("docker rm -f $(docker ps -aq --filter label=gpum.managed=true)"),
            "{:?}",
            u.errors
        );
    }

    #[tokio::test]
    async fn without_systemd_says_so_and_goes_on() {
        let h = FakeHost::new().dir(CONFIG_DIR).file("/etc/gpum-agent/config.toml", "t");
        let u = uninstall(&h, no_docker(), Lang::Ru).await;
        assert!(!h.ran().iter().any(|c| c.program == "systemctl"), "no systemctl without systemd");
        assert_eq!(u.removed, vec![CONFIG_DIR.to_string()]);
        assert!(u.notes[0].contains("systemd не запущен"));
        let text = render(&u, Lang::Ru);
        assert!(
            text.contains("Удалено:")
                && text.contains("/etc/gpum-agent")
                && text.contains("образы оставлены")
        );
    }

    #[tokio::test]
    async fn in_russian_every_line_is_russian() {
        let h = FakeHost::new()
            .dir(SYSTEMD_RUNTIME_DIR)
            .file(UNIT_PATH, "[Unit]")
            .command("systemctl stop gpum-agent", ok())
            .command("systemctl disable gpum-agent", ok())
            .command("systemctl daemon-reload", ok());
        let u = uninstall(&h, no_docker(), Lang::Ru).await;
        assert_eq!(u.removed[0], "служба gpum-agent (остановлена, отключена)");
        assert!(
            u.errors[0].starts_with("контейнеры с меткой gpum.managed=true не удалены ("),
            "{:?}",
            u.errors
        );
        let text = render(&u, Lang::Ru);
        assert!(text.starts_with("Удалено:\n  - служба gpum-agent"), "{text}");
        assert!(text.contains("\nНе удалось: контейнеры с меткой"), "{text}");
    }

    /// The egress table goes with `nft -f -` of a delete of gpum's table only, and a table
    /// still listed afterwards is a failure the summary shows.
    #[tokio::test]
    async fn the_egress_table_goes_and_a_table_left_is_reported() {
        let list = "nft -j list table inet gpum_rentals";
        let h = FakeHost::new()
            .command(
                list,
                Ok(Output { code: Some(0), stdout: b"{\"nftables\": []}".to_vec(), ..Default::default() }),
            )
            .command("nft -f -", ok());
        let u = uninstall(&h, no_docker(), Lang::En).await;
        let ran = h.ran();
        let del = ran.iter().find(|c| c.display() == "nft -f -").expect("the delete ran");
        assert_eq!(
            del.stdin.as_deref(),
            Some(&b"table inet gpum_rentals\ndelete table inet gpum_rentals\n"[..])
        );
        assert!(u.errors.iter().any(|e| e.contains("inet gpum_rentals is still there")), "{:?}", u.errors);

        // Absent: nothing deleted, nothing said.
        let h = FakeHost::new().command(
            list,
            Ok(Output {
                code: Some(1),
                stderr: b"Error: No such file or directory".to_vec(),
                ..Default::default()
            }),
        );
        let u = uninstall(&h, no_docker(), Lang::En).await;
        assert!(!h.ran().iter().any(|c| c.display() == "nft -f -"));
        assert!(!u.errors.iter().any(|e| e.contains("nftables")), "{:?}", u.errors);
    }

    #[test]
    fn the_hint_for_containers_left_names_the_command() {
        let e = DockerError::Unavailable("gone {label}".into());
        assert_eq!(
            docker_left("gpum.probe", &e, Lang::En),
            format!(
                "containers labelled gpum.probe=true were not removed ({e}); once Docker runs, remove them with \
                 docker rm -f $(docker ps -aq --filter label=gpum.probe=true) (check the list first: a container \
                 that got the label from its image is not gpum's)"
            )
        );
        assert_eq!(
            docker_left("gpum.probe", &e, Lang::Ru),
            format!(
                "контейнеры с меткой gpum.probe=true не удалены ({e}); когда Docker заработает, удалите их: \
                 docker rm -f $(docker ps -aq --filter label=gpum.probe=true) (сначала проверьте список: \
                 контейнеры, получившие метку от своего образа, принадлежат не gpum)"
            )
        );
    }

    #[test]
    fn the_summary_escapes_container_names_and_engine_errors() {
        let u = Uninstalled {
            removed: vec!["container evil\x1b[2J\x1b[H (gpum.managed=true)".into()],
            notes: vec!["n\rforged".into()],
            errors: vec!["engine said \x1b]0;x\x07\nRemoved: everything".into()],
        };
        for lang in [Lang::Ru, Lang::En] {
            let t = render(&u, lang);
            assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
            assert_eq!(t.lines().count(), 5, "{t}");
            assert!(t.contains("evil\\x1b[2J"), "{t}");
        }
    }

    #[tokio::test]
    async fn refuses_without_a_tty_and_without_root() {
        let h = FakeHost::new();
        assert_eq!(run(&h, false, Err(DockerError::Unavailable("x".into())), Lang::En).await, exit::USAGE);
        let h = FakeHost::new().with_euid(1000);
        assert_eq!(run(&h, true, Err(DockerError::Unavailable("x".into())), Lang::En).await, exit::NOT_ROOT);
        assert!(h.ran().is_empty() && h.writes().is_empty());
    }
}
