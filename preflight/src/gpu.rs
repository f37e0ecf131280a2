//! The NVIDIA driver as NVML sees it.
//!
//! This is the one fact not gathered through [`gpum_host::Host`]: NVML is a vendor library
//! loaded into the process (`dlopen`), and it changes nothing. [`GpuProbe`] lets unit tests
//! supply the answer. The real probe loads [`DEFAULT_NVML_LIB`] by name, as the dynamic loader
//! finds it; only a build with the `test-knobs` feature (the installer's turns it on) lets
//! `GPUM_NVML_LIB` point it at another library (the simulated NVML under `tests/`). In a release
//! build the variable is never read: a library named there would run its constructors inside
//! the installer, as root (issue 29, item 8).

use std::ffi::OsStr;

use gpum_host::Host;
#[cfg(any(test, feature = "test-knobs"))]
use gpum_host::env;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

/// The library the driver installs. The unversioned `libnvidia-ml.so` (nvml-wrapper's default)
/// comes only with development packages, so the versioned name is what a driver-only machine has.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// What NVML said, with the failure states told apart because each has a different fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuFacts {
    /// `dlopen` failed: no driver userspace installed (or, in a test build, `GPUM_NVML_LIB` is
    /// wrong).
    LibraryMissing {
        lib: String,
        detail: String,
    },
    /// The library loaded but lacks NVML's symbols.
    LibraryBroken {
        lib: String,
        detail: String,
    },
    /// The kernel module is not loaded.
    DriverNotLoaded,
    /// The kernel module and the library are different driver versions (usually: updated
    /// without a reboot).
    VersionMismatch,
    NoPermission,
    /// NVML works but sees no GPU.
    NoDevices {
        driver: String,
    },
    Ok {
        driver: String,
        gpus: Vec<String>,
    },
    Other(String),
}

/// Asks the driver about GPUs.
pub trait GpuProbe {
    fn probe(&self, host: &dyn Host) -> GpuFacts;
}

/// Facts already known answer for themselves: a probe with a fixed answer, for unit tests of
/// the checks and of the installer.
impl GpuProbe for GpuFacts {
    fn probe(&self, _: &dyn Host) -> GpuFacts {
        self.clone()
    }
}

/// The real probe, through nvml-wrapper.
#[derive(Debug, Default, Clone, Copy)]
pub struct NvmlProbe;

/// The library [`NvmlProbe`] loads: [`DEFAULT_NVML_LIB`]. With the `test-knobs` feature (and in
/// this crate's unit tests) a non-empty `GPUM_NVML_LIB` names another one; without it the
/// variable is not read at all.
pub fn nvml_lib(host: &dyn Host) -> String {
    #[cfg(any(test, feature = "test-knobs"))]
    if let Some(lib) = host.env(env::GPUM_NVML_LIB).filter(|s| !s.is_empty()) {
        return lib;
    }
    let _ = host;
    DEFAULT_NVML_LIB.to_string()
}

impl GpuProbe for NvmlProbe {
    fn probe(&self, host: &dyn Host) -> GpuFacts {
        let lib = nvml_lib(host);
        let nvml = match Nvml::builder().lib_path(OsStr::new(&lib)).init() {
            Ok(n) => n,
            Err(e) => return classify(&lib, e),
        };
        let driver = nvml.sys_driver_version().unwrap_or_default();
        match nvml.device_count() {
            Ok(0) => GpuFacts::NoDevices { driver },
            Ok(n) => {
                let gpus = (0..n)
                    .map(|i| {
                        nvml.device_by_index(i)
                            .and_then(|d| d.name())
                            .unwrap_or_else(|e| format!("GPU {i} ({e})"))
                    })
                    .collect();
                GpuFacts::Ok { driver, gpus }
            }
            Err(e) => classify(&lib, e),
        }
    }
}

fn classify(lib: &str, e: NvmlError) -> GpuFacts {
    match e {
        NvmlError::LibloadingError(d) => GpuFacts::LibraryMissing { lib: lib.into(), detail: d.to_string() },
        NvmlError::FailedToLoadSymbol(d) => GpuFacts::LibraryBroken { lib: lib.into(), detail: d },
        NvmlError::DriverNotLoaded => GpuFacts::DriverNotLoaded,
        NvmlError::LibRmVersionMismatch => GpuFacts::VersionMismatch,
        NvmlError::NoPermission => GpuFacts::NoPermission,
        other => GpuFacts::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn a_missing_library_is_told_apart() {
        let h = FakeHost::new().env_var(env::GPUM_NVML_LIB, "/nonexistent/libnvidia-ml.so.1");
        match NvmlProbe.probe(&h) {
            GpuFacts::LibraryMissing { lib, detail } => {
                assert_eq!(lib, "/nonexistent/libnvidia-ml.so.1");
                assert!(!detail.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_library_without_nvml_symbols_is_broken_not_missing() {
        // libc is a real shared library that has no NVML symbols.
        let h = FakeHost::new().env_var(env::GPUM_NVML_LIB, "libc.so.6");
        assert!(matches!(NvmlProbe.probe(&h), GpuFacts::LibraryBroken { .. }), "{:?}", NvmlProbe.probe(&h));
    }

    #[test]
    fn error_classes() {
        assert_eq!(classify("l", NvmlError::DriverNotLoaded), GpuFacts::DriverNotLoaded);
        assert_eq!(classify("l", NvmlError::LibRmVersionMismatch), GpuFacts::VersionMismatch);
        assert_eq!(classify("l", NvmlError::NoPermission), GpuFacts::NoPermission);
        assert!(matches!(classify("l", NvmlError::Unknown), GpuFacts::Other(_)));
    }
}
