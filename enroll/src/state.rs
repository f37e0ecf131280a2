//! Reading and writing `state.json` (schema: [`gpum_common::agent_state::AgentState`]).
//!
//! Registration writes a fresh one; then the agent's core decides when it is written: when it
//! changed in more than its timestamps, else every `STATE_REFRESH` (30 s) so that `status` shows
//! a recent heartbeat, and always when the agent stops for good. Every write is atomic (a
//! temporary file renamed over it), so `status` never reads a half-written file. It holds no
//! secret, so it is written 0644.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

// The one reader (and path) of the state file, shared with the installer's
// `existing_install` check so the two cannot disagree on what a state file says.
use gpum_common::agent_state::AgentState;
pub use gpum_common::agent_state::{read, state_path};
use gpum_host::Host;

/// Unix seconds of `t`.
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Writes the state atomically, stamping `updated_at`. Creates the directory when missing.
pub fn write(host: &dyn Host, state_dir: &Path, st: &mut AgentState) -> std::io::Result<()> {
    st.updated_at = unix(host.now());
    if !host.is_dir(state_dir) {
        host.create_dir_all(state_dir, 0o700)?;
    }
    let json = serde_json::to_vec_pretty(st).expect("state serializes");
    host.write_atomic(&state_path(state_dir), &json, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_common::agent_state::Connection;
    use gpum_host::fake::FakeHost;

    #[test]
    fn roundtrip() {
        let h = FakeHost::new();
        let d = Path::new("/var/lib/gpum-agent");
        assert_eq!(read(&h, d).unwrap(), None);
        let mut st =
            AgentState { node_id: Some("n".into()), connection: Connection::Connected, ..Default::default() };
        write(&h, d, &mut st).unwrap();
        let back = read(&h, d).unwrap().unwrap();
        assert_eq!(back, st);
        assert_eq!(back.updated_at, unix(h.now));
    }
}
