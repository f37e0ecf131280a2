//! The waits: for Docker after a reload or a restart, for the service's first accepted
//! heartbeat, and for the first GPU check.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use gpum_common::Failure;
use gpum_common::agent_state::{self, Connection};
use gpum_host::Cmd;
use gpum_protocol::VerificationState;

use super::steps::must;
use super::{GpuCheck, Outcome, POLL, Reporter, Run};
use crate::text::{Msg, t};

/// How long [`Run::wait_for_runtime`] waits for the `nvidia` runtime after a reload.
pub(super) const RUNTIME_WAIT: Duration = Duration::from_secs(10);
/// How long [`Run::wait_for_engine`] waits for the engine after a restart.
pub(super) const ENGINE_WAIT: Duration = Duration::from_secs(60);

impl Run<'_> {
    /// After `systemctl reload docker`: a reload is a SIGHUP, which dockerd applies on its own
    /// time; up to 10 s for the `nvidia` runtime to be listed.
    pub(super) fn wait_for_runtime(&self) -> Result<(), Failure> {
        for _ in 0..RUNTIME_WAIT.as_millis() / 250 {
            if self.engine_has_runtime() {
                return Ok(());
            }
            self.host.sleep(Duration::from_millis(250));
        }
        Err(Failure::SetupFailed(
            "dockerd did not list the nvidia runtime after systemctl reload docker".into(),
        ))
    }

    /// After `systemctl restart docker`: up to 60 s for the engine to answer.
    pub(super) fn wait_for_engine(&self) -> Result<(), Failure> {
        for _ in 0..ENGINE_WAIT.as_millis() / POLL.as_millis() {
            if self.engine_answers() {
                return Ok(());
            }
            self.host.sleep(POLL);
        }
        Err(Failure::SetupFailed("Docker did not answer within 60 s of its restart".into()))
    }

    fn engine_answers(&self) -> bool {
        let h = self.host.as_ref();
        h.unix_http_get(&self.facts.docker.socket, "/_ping").is_ok_and(|r| r.status == 200)
    }

    fn engine_has_runtime(&self) -> bool {
        crate::dockerd::engine_lists_runtime(self.host.as_ref(), &self.facts.docker.socket) == Some(true)
    }

    pub(super) fn start(&mut self, name: &str, wait_secs: u64) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let node = self.node.as_ref().map(|n| n.node_id.clone()).unwrap_or_default();
        let t0 = h.now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let _p = self.progress.wait(Msg::ProgressHeartbeat, Duration::from_secs(wait_secs));
        for args in [vec!["daemon-reload"], vec!["enable", name]] {
            must(h, &Cmd::new("systemctl").args(args)).map_err(|_| Failure::ServiceFailed)?;
        }
        // A unit that stopped for good (78) is "failed"; clear that so it can start again.
        let _ = h.run(&Cmd::new("systemctl").args(["reset-failed", name]));
        must(h, &Cmd::new("systemctl").args(["restart", name])).map_err(|_| Failure::ServiceFailed)?;
        for _ in 0..wait_secs * 2 {
            if let Ok(Some(st)) = agent_state::read(h, Path::new(agent_state::DEFAULT_STATE_DIR)) {
                if st.node_id.as_deref() == Some(&node)
                    && st.connection == Connection::Connected
                    && st.last_heartbeat_at.is_some_and(|at| at + 2 >= t0)
                {
                    return Ok(Outcome::Done(Some(t(Msg::AgentOnline, self.lang()).into())));
                }
                // A stop written since the restart, by a service that is now down (78 leaves
                // it down: RestartPreventExitStatus). A stop alone is not enough: the agent
                // that ran before this restart may have been told its token was replaced (the
                // registration above revokes it) and written its stop just before it was
                // replaced by the new process, which overwrites the state at its first answer.
                if st.stopped.is_some() && st.updated_at + 2 >= t0 && self.service_down(name) {
                    return Err(Failure::ServiceFailed);
                }
            }
            h.sleep(POLL);
        }
        Err(Failure::ServiceFailed)
    }

    fn service_down(&self, name: &str) -> bool {
        let h = self.host.as_ref();
        h.run(&Cmd::new("systemctl").args(["is-active", name]))
            .is_ok_and(|o| matches!(o.stdout_str().trim(), "failed" | "inactive"))
    }

    pub(super) fn gpu_check(&mut self, wait_secs: u64, rep: &mut Reporter) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let lang = self.lang();
        // A repair did not register, so the platform's probe image is what the agent's state
        // says its first answer named (the start step waited for that answer).
        let probe = if self.kept {
            agent_state::read(h, Path::new(agent_state::DEFAULT_STATE_DIR))
                .ok()
                .flatten()
                .and_then(|st| st.probe_image)
        } else {
            self.node.as_ref().and_then(|n| n.probe_image.clone())
        };
        if probe.is_none() {
            self.summary.verification = Some(GpuCheck::Known(VerificationState::AwaitingCheck));
            return Ok(Outcome::Done(Some(t(Msg::AwaitingCheck, lang).into())));
        }
        rep.note(&t(Msg::WaitingForCheck, lang).replace("{secs}", &wait_secs.to_string()));
        let _p = self.progress.wait(Msg::ProgressGpuCheck, Duration::from_secs(wait_secs));
        for _ in 0..wait_secs * 2 {
            if let Ok(Some(st)) = agent_state::read(h, Path::new(agent_state::DEFAULT_STATE_DIR)) {
                match st.verification {
                    Some(v @ VerificationState::Verified) => {
                        self.summary.verification = Some(GpuCheck::Known(v));
                        return Ok(Outcome::Done(Some(t(Msg::Verified, lang).into())));
                    }
                    Some(VerificationState::Failed) => return Err(Failure::GpuNotInContainer),
                    Some(VerificationState::AwaitingCheck) | None => {}
                }
            }
            h.sleep(POLL);
        }
        self.summary.verification = Some(GpuCheck::StillRunning);
        Ok(Outcome::Done(Some(t(Msg::CheckStillRunning, lang).into())))
    }
}
