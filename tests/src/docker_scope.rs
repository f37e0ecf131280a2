//! A test's own corner of the real Docker engine, shared by the suites that drive it
//! (`tests/e2e/docker.rs`, `tests/e2e/rental.rs`): a unique `gpum.test.scope` label that the
//! agent's clients are narrowed to, every container carrying it removed (with its anonymous
//! volumes) when the scope is dropped; and the `docker` CLI for looking from outside the agent.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::Command;

use gpum_agent::docker::Docker;

pub const SCOPE_KEY: &str = "gpum.test.scope";

/// A unique scope for one test; removes every container carrying it when dropped.
pub struct Scope {
    pub value: String,
}

impl Scope {
    /// A scope named after `test`, on an engine that answers (else the test fails, saying so).
    pub fn new(test: &str) -> Self {
        crate::require_docker(test);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        Scope { value: format!("{test}-{}-{nanos:08x}", std::process::id()) }
    }

    /// The agent's engine client, narrowed to this scope.
    pub fn docker(&self) -> Docker {
        self.docker_at(None)
    }

    /// A client in this scope for the engine at `socket` (default: the engine's own).
    pub fn docker_at(&self, socket: Option<&Path>) -> Docker {
        Docker::connect(socket)
            .expect("the engine answered require_docker")
            .with_test_scope(SCOPE_KEY, &self.value)
    }

    /// The label every container of this scope carries.
    pub fn label(&self) -> String {
        format!("{SCOPE_KEY}={}", self.value)
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let ids = docker(&["ps", "-aq", "--filter", &format!("label={}", self.label())]);
        let ids: Vec<&str> = ids.lines().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(ids);
            let _ = Command::new("docker").args(&args).output();
        }
    }
}

/// Runs the docker CLI, panicking on failure; returns stdout.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker CLI");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether the engine knows a `kind` (container, network, volume…) named `name`.
pub fn exists(kind: &str, name: &str) -> bool {
    Command::new("docker").args([kind, "inspect", name]).output().unwrap().status.success()
}
