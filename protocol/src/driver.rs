//! The NVIDIA driver's capabilities a rental may ask for (issue 43): which parts of the driver
//! the NVIDIA Container Toolkit mounts into its container (`NVIDIA_DRIVER_CAPABILITIES`). One
//! rule for the platform, which accepts a rental's list, and the agent, which sets the variable
//! from it, so neither accepts a name the other refuses.
//!
//! The names are the toolkit's own set (NVIDIA/nvidia-container-toolkit
//! `internal/config/image/capabilities.go`, `SupportedDriverCapabilities`); a name outside it
//! would fail the container's start in the toolkit's hook, and the keywords `all` and `none` are
//! not names: a list says each part it wants.

/// Every capability the toolkit knows, in its sorted order.
pub const DRIVER_CAPABILITIES: [&str; 7] =
    ["compat32", "compute", "display", "graphics", "ngx", "utility", "video"];

/// What a rental gets when its spec names none: CUDA and NVML/`nvidia-smi` (the toolkit's own
/// default, `DefaultDriverCapabilities`).
pub const DEFAULT_DRIVER_CAPABILITIES: [&str; 2] = ["compute", "utility"];

/// Checks a rental's list: each name one of [`DRIVER_CAPABILITIES`], each once. The error names
/// the first name refused. An empty list is valid (the default).
pub fn check_driver_capabilities(list: &[String]) -> Result<(), String> {
    for (i, c) in list.iter().enumerate() {
        if !DRIVER_CAPABILITIES.contains(&c.as_str()) {
            let shown: String = c.chars().take(32).collect();
            return Err(format!(
                "driver_capabilities: {:?} is not one of {}",
                shown.escape_debug().to_string(),
                DRIVER_CAPABILITIES.join(", ")
            ));
        }
        if list[..i].contains(c) {
            return Err(format!("driver_capabilities: {c} is listed twice"));
        }
    }
    Ok(())
}

/// The value of `NVIDIA_DRIVER_CAPABILITIES` for `list` (checked): the names joined by `,`, or
/// [`DEFAULT_DRIVER_CAPABILITIES`] for an empty list.
pub fn driver_capabilities_value(list: &[String]) -> String {
    if list.is_empty() { DEFAULT_DRIVER_CAPABILITIES.join(",") } else { list.join(",") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn only_the_toolkits_names_each_once() {
        assert_eq!(check_driver_capabilities(&[]), Ok(()));
        assert_eq!(check_driver_capabilities(&v(&DRIVER_CAPABILITIES)), Ok(()));
        assert_eq!(check_driver_capabilities(&v(&["video", "compute"])), Ok(()));
        for bad in [
            &["all"][..],
            &["none"],
            &["compute", "all"],
            &["Compute"],
            &[" compute"],
            &[""],
            &["compute,video"],
            &["gpu"],
        ] {
            let e = check_driver_capabilities(&v(bad)).unwrap_err();
            assert!(e.starts_with("driver_capabilities: "), "{bad:?}: {e}");
        }
        assert!(check_driver_capabilities(&v(&["compute", "compute"])).unwrap_err().contains("twice"));
        assert_eq!(driver_capabilities_value(&[]), "compute,utility");
        assert_eq!(driver_capabilities_value(&v(&["utility", "video"])), "utility,video");
    }
}
