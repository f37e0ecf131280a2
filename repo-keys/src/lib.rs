//! The installer's trust chain: which apt repositories gpum adds and which keys may sign them
//! ([`pinned`]), verification of a downloaded repository key and the keyring written from it
//! ([`keys`]), the deb822 source and the detection of clashing apt entries ([`sources`]),
//! verification of apt `InRelease` files ([`inrelease`]), and of gpum's own signed release
//! artifacts ([`release`]). See ARCHITECTURE.md, "Trust chain", and docs/trust.md.
//!
//! Everything that verifies takes the trusted fingerprints as a parameter, so tests use
//! throwaway keys and a vendor's key rotation is a one-line change in [`pinned`].

pub mod inrelease;
pub mod keys;
pub mod pinned;
pub mod release;
pub mod sources;
