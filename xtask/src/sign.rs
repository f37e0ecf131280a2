//! Development release keys and artifact signing (filled in by the trust-chain work).

use anyhow::{Result, bail};
use clap::Args;

#[derive(Args)]
pub struct ReleaseKeyArgs {}

#[derive(Args)]
pub struct SignArgs {}

pub fn release_key(_a: ReleaseKeyArgs) -> Result<()> {
    bail!("not yet implemented")
}

pub fn sign(_a: SignArgs) -> Result<()> {
    bail!("not yet implemented")
}
