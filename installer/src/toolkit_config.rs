//! `/etc/nvidia-container-runtime/config.toml`: the two settings that decide how an
//! unprivileged container gets GPUs, changed in place and nothing else.
//!
//! gpum sets `accept-nvidia-visible-devices-envvar-when-unprivileged = false` (an image's or a
//! tenant's `NVIDIA_VISIBLE_DEVICES` no longer chooses GPUs) and
//! `accept-nvidia-visible-devices-as-volume-mounts = true` (the hook takes the device list from
//! the `/dev/null` mounts under `/var/run/nvidia-container-devices/` that only whoever creates
//! the container adds: the agent, for a rental's UUIDs). Why both, and why mounts rather than the
//! variable, is docs/agent.md's "How a rental gets its GPUs".
//!
//! The file is the owner's and the toolkit package's (its postinst rewrites it with
//! `nvidia-ctk config --in-place`, which keeps set values): a key already set is changed on its own
//! line, a key the package left commented out (`#key = default`) gets its line right below the
//! comment, and a key that is nowhere goes at the end of the top-level keys, before the first
//! table. Every other line, comment and blank stays. The result is parsed again and must say
//! exactly gpum's two values, else nothing is written.

use gpum_preflight::parse::toolkit_config::{self, AS_VOLUME_MOUNTS, ENVVAR_WHEN_UNPRIVILEGED};

use crate::daemon_json::Merged;

/// The lines gpum wants, in the order a new file gets them.
const SETTINGS: [(&str, &str); 2] = [(ENVVAR_WHEN_UNPRIVILEGED, "false"), (AS_VOLUME_MOUNTS, "true")];

/// `line` sets `key` (`key = …`, `key=…`), or with `commented` has it commented out (`#key = …`).
fn sets(line: &str, key: &str, commented: bool) -> bool {
    let mut l = line.trim_start();
    if commented {
        let Some(rest) = l.strip_prefix('#') else { return false };
        l = rest.trim_start();
    }
    l.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
}

/// gpum's two settings in `old` (`None`: no file). A file that is not TOML, or whose edit would
/// not read back as gpum's values (a quoted key, a value over several lines), is refused.
pub fn configure(old: Option<&str>) -> Result<Merged, String> {
    let old = old.unwrap_or("");
    if toolkit_config::parse(old)?.is_gpums() {
        return Ok(Merged::Unchanged);
    }
    let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
    for (key, value) in SETTINGS {
        let wanted = format!("{key} = {value}");
        // The top-level keys are the lines before the first table header.
        let top = lines.iter().position(|l| l.trim_start().starts_with('[')).unwrap_or(lines.len());
        if let Some(i) = lines[..top].iter().position(|l| sets(l, key, false)) {
            lines[i] = wanted;
        } else if let Some(i) = lines[..top].iter().position(|l| sets(l, key, true)) {
            lines.insert(i + 1, wanted);
        } else {
            let mut at = top;
            while at > 0 && lines[at - 1].trim().is_empty() {
                at -= 1;
            }
            lines.insert(at, wanted);
        }
    }
    let mut new = lines.join("\n");
    new.push('\n');
    match toolkit_config::parse(&new) {
        Ok(c) if c.is_gpums() => Ok(Merged::Changed(new)),
        Ok(_) => Err("the settings could not be changed in place (a quoted key?)".into()),
        Err(e) => Err(format!("the changed file would not be valid TOML ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/preflight/nvidia-container-runtime-config.toml");
        std::fs::read_to_string(p).unwrap()
    }

    fn changed(old: Option<&str>) -> String {
        match configure(old).unwrap() {
            Merged::Changed(t) => t,
            Merged::Unchanged => panic!("unchanged"),
        }
    }

    #[test]
    fn the_packages_file_gets_two_lines_below_their_comments_and_nothing_else() {
        let old = shipped();
        let new = changed(Some(&old));
        let (o, n): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
        assert_eq!(n.len(), o.len() + 2, "{new}");
        assert_eq!(n[0], "#accept-nvidia-visible-devices-as-volume-mounts = false");
        assert_eq!(n[1], "accept-nvidia-visible-devices-as-volume-mounts = true");
        assert_eq!(n[2], "#accept-nvidia-visible-devices-envvar-when-unprivileged = true");
        assert_eq!(n[3], "accept-nvidia-visible-devices-envvar-when-unprivileged = false");
        let rest: Vec<&str> =
            n.iter().enumerate().filter(|(i, _)| *i != 1 && *i != 3).map(|(_, l)| *l).collect();
        assert_eq!(rest, o, "every other line, in its order");
        assert!(toolkit_config::parse(&new).unwrap().is_gpums());
        assert_eq!(configure(Some(&new)).unwrap(), Merged::Unchanged, "a re-run writes nothing");
    }

    #[test]
    fn set_values_change_on_their_own_line_and_table_keys_of_the_same_name_stay() {
        let old = "# owner's note\naccept-nvidia-visible-devices-envvar-when-unprivileged=true\n\
                   disable-require = false\n\n[nvidia-container-cli]\n\
                   accept-nvidia-visible-devices-as-volume-mounts = false\nload-kmods = true\n";
        let new = changed(Some(old));
        assert_eq!(
            new,
            "# owner's note\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n\
             disable-require = false\naccept-nvidia-visible-devices-as-volume-mounts = true\n\n\
             [nvidia-container-cli]\naccept-nvidia-visible-devices-as-volume-mounts = false\nload-kmods = true\n"
        );
    }

    #[test]
    fn no_file_gets_just_the_two_settings() {
        for old in [None, Some(""), Some("\n")] {
            let new = changed(old);
            assert!(toolkit_config::parse(&new).unwrap().is_gpums(), "{new}");
            assert_eq!(new.trim().lines().filter(|l| !l.is_empty()).count(), 2, "{new:?}");
        }
    }

    #[test]
    fn broken_or_unchangeable_files_are_refused() {
        assert!(configure(Some("[unclosed\n")).is_err());
        assert!(configure(Some("accept-nvidia-visible-devices-as-volume-mounts = 1\n")).is_err());
        // A quoted key is not recognised on its line; the edit would repeat it: refused.
        assert!(
            configure(Some("\"accept-nvidia-visible-devices-envvar-when-unprivileged\" = true\n")).is_err()
        );
    }
}
