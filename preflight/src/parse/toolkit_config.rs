//! `/etc/nvidia-container-runtime/config.toml`, the NVIDIA Container Toolkit's settings: which
//! ways an unprivileged container may ask for GPUs.
//!
//! The two top-level keys gpum reads are the toolkit's own (`api/config/v1/config.go` in
//! NVIDIA/nvidia-container-toolkit): `accept-nvidia-visible-devices-envvar-when-unprivileged`
//! (default `true`: an image's `NVIDIA_VISIBLE_DEVICES=all` gets every GPU) and
//! `accept-nvidia-visible-devices-as-volume-mounts` (default `false`: the device list as
//! `/dev/null` mounts under `/var/run/nvidia-container-devices/`, which only whoever creates the
//! container can add). A key that is absent, or commented out as the package ships it, has its
//! default.

/// The first key.
pub const ENVVAR_WHEN_UNPRIVILEGED: &str = "accept-nvidia-visible-devices-envvar-when-unprivileged";
/// The second key.
pub const AS_VOLUME_MOUNTS: &str = "accept-nvidia-visible-devices-as-volume-mounts";

/// What the toolkit's hook does with those two settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolkitConfig {
    pub envvar_when_unprivileged: bool,
    pub as_volume_mounts: bool,
}

impl Default for ToolkitConfig {
    /// The toolkit's defaults (no file, or neither key set).
    fn default() -> Self {
        ToolkitConfig { envvar_when_unprivileged: true, as_volume_mounts: false }
    }
}

impl ToolkitConfig {
    /// What gpum needs: no GPU from an unprivileged container's environment, and the device list
    /// from the mounts the agent adds.
    pub fn is_gpums(&self) -> bool {
        !self.envvar_when_unprivileged && self.as_volume_mounts
    }
}

/// Reads the two settings; a file that is not TOML, or a key that is not a boolean, is an error
/// (the toolkit's hook would fail on it too).
pub fn parse(text: &str) -> Result<ToolkitConfig, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let mut c = ToolkitConfig::default();
    for (key, slot) in [
        (ENVVAR_WHEN_UNPRIVILEGED, &mut c.envvar_when_unprivileged),
        (AS_VOLUME_MOUNTS, &mut c.as_volume_mounts),
    ] {
        match table.get(key) {
            None => {}
            Some(toml::Value::Boolean(b)) => *slot = *b,
            Some(v) => return Err(format!("{key} is {}, not true or false", v.type_str())),
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::fixture;

    #[test]
    fn as_the_package_ships_it_the_defaults_hold() {
        let c = parse(&fixture("nvidia-container-runtime-config.toml")).unwrap();
        assert_eq!(c, ToolkitConfig::default());
        assert!(!c.is_gpums());
        assert_eq!(parse("").unwrap(), ToolkitConfig::default());
    }

    #[test]
    fn set_keys_are_read_and_a_table_key_of_the_same_name_is_not_them() {
        let t = "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n\
                 accept-nvidia-visible-devices-as-volume-mounts = true\n";
        assert!(parse(t).unwrap().is_gpums());
        let t = "[nvidia-container-cli]\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n";
        assert_eq!(parse(t).unwrap(), ToolkitConfig::default());
    }

    #[test]
    fn broken_files_and_wrong_types_are_errors() {
        assert!(parse("accept-nvidia-visible-devices-envvar-when-unprivileged = \"false\"\n").is_err());
        assert!(parse("[unclosed\n").is_err());
        assert!(parse("a = 1\na = 2\n").is_err());
    }
}
