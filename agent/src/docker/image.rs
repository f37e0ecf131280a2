//! Which images the agent runs, probes and rentals alike: the protocol's one set of rules
//! (`gpum_protocol::image`, issue 44, item 7), which the platform checks with too.
//! [`super::probe`] and [`super::rental`] resolve an accepted reference against the engine.

pub use gpum_protocol::image::{DOCKER_HUB, MAX_REFERENCE_LEN, PinnedImage, RefError};
// The registry rules are the config's (gpum-enroll), which the installer shares.
pub use gpum_enroll::config::{DEFAULT_REGISTRIES, valid_registry};
