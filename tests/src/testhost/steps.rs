//! Steps every scenario shares, on one running [`Host`]: the dashboard's one-liner, the simulated
//! GPU's file, the operator's check image, the platform's node list, and waiting for a condition.
//! (They were the scenario binary's own until the rental scenarios, `super::rental`, needed them.)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Host, Run};

/// The test platform's URL, where the host's unit serves it (127.0.0.1:8443).
pub const PLATFORM_URL: &str = "https://127.0.0.1:8443";

/// The dashboard's one-liner as root: `curl … | sudo bash -s -- ARGS`.
pub fn install(h: &Host, args: &str, env: &[(&str, &str)], user: Option<&str>) -> Result<Run> {
    install_from(h, PLATFORM_URL, args, env, user)
}

/// The one-liner of the platform at `url` (its `--public-url`, which `install.sh` carries on to
/// the installer and the agent).
pub fn install_from(
    h: &Host,
    url: &str,
    args: &str,
    env: &[(&str, &str)],
    user: Option<&str>,
) -> Result<Run> {
    let cmd = format!("curl -fsSL {url}/install.sh | sudo bash -s -- {args}");
    h.exec(user, env, &cmd, None)
}

/// Writes the simulated machine's `/etc/gpum-sim/gpu.json` (docs/testhost.md).
pub fn set_gpu(h: &Host, json: &str) -> Result<()> {
    h.write_file("/etc/gpum-sim/gpu.json", format!("{json}\n").as_bytes(), 0o644)
}

/// Points the platform at the host's probe image, by digest (`gpum-test/probe@sha256:<id>`).
pub fn set_probe_image(h: &Host) -> Result<()> {
    let host: serde_json::Value = serde_json::from_str(&h.sh_ok("cat /etc/gpum-test/host.json")?)?;
    let id = host["probe_image_id"].as_str().context("probe_image_id")?;
    h.platform(&format!("probe-image set gpum-test/probe@{id}"))?;
    Ok(())
}

/// The platform's nodes, as its admin CLI lists them.
pub fn nodes(h: &Host) -> Result<Vec<gpum_protocol::NodeSummary>> {
    let list: gpum_protocol::NodeList = serde_json::from_value(h.nodes()?)?;
    Ok(list.nodes)
}

/// Polls `cond` (a shell test on the host) every 100 ms for up to `secs`.
pub fn wait_until(h: &Host, cond: &str, secs: u64, what: &str) -> Result<()> {
    let start = Instant::now();
    while h.sh(cond)?.code != 0 {
        if start.elapsed() > Duration::from_secs(secs) {
            bail!("{what}: not within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
