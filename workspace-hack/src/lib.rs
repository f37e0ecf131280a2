//! No code: this crate's `Cargo.toml` names every third-party crate the workspace builds with
//! more than one feature set, with the union of those features, and every workspace crate
//! depends on it. So `cargo xtask`, `cargo build --workspace`, `cargo nextest run -p …` and
//! the release builds each compile a dependency once instead of once per selection
//! (ARCHITECTURE.md, "Builds"). Regenerate after changing dependencies:
//! `cargo hakari generate && cargo hakari manage-deps`.
