//! The agent's one door to the Docker Engine, through bollard.
//!
//! Two promises in the owner's guide go through here, and both are made to people who run their
//! own containers on the same machine:
//! - the GPU probe ([`probe`]): one short container with `--gpus all` that runs `nvidia-smi`;
//! - the reconciler ([`reconcile`]): containers labelled `gpum.managed=true` that the platform
//!   does not know are removed after a grace period, and no other container is ever touched.
//!
//! [`Docker`] wraps a bollard client for a Unix socket. Connecting only checks that the socket
//! exists; the API version is negotiated on the first call that reaches the engine (this
//! machine's engine speaks API 1.41, older than bollard's default), and is retried on later
//! calls while the engine is down. Every failure comes back as a [`DockerError`], never as a
//! panic: when Docker is stopped or the socket is missing the agent reports it in the heartbeat
//! and keeps running. Short calls carry their own deadline ([`CALL_TIMEOUT`]) so that a hung
//! engine cannot stall the heartbeat loop.
//!
//! Test scoping: tests of several processes share one engine, and `cleanup_leftovers`, the
//! reconciler and `uninstall` act on *every* container carrying a gpum label. A test builds its
//! client with the hidden [`Docker::with_test_scope`], which adds one more label (key under
//! `gpum.test.`) to every container the client creates and to every label filter it lists
//! with, so one test never sees another's containers. Production code never calls it.

pub mod probe;
pub mod reconcile;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::container::{ListContainersOptions, RemoveContainerOptions};

/// The socket the engine listens on unless told otherwise.
pub const DEFAULT_SOCKET: &str = gpum_host::env::DEFAULT_DOCKER_SOCKET;
/// The label on every container the platform asks the agent to manage.
pub const LABEL_MANAGED: &str = "gpum.managed";
/// The label on the agent's own probe containers.
pub const LABEL_PROBE: &str = "gpum.probe";
/// The deadline of every short engine call (list, inspect, stop, remove, info, version).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The prefix a test scope label key must carry.
const TEST_SCOPE_PREFIX: &str = "gpum.test.";

/// What can go wrong talking to the engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerError {
    /// No engine answers: the socket is missing, refuses connections, or the call timed out.
    #[error("Docker is unavailable: {0}")]
    Unavailable(String),
    /// The container or image does not exist (HTTP 404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The engine answered with an error.
    #[error("Docker engine error {status}: {message}")]
    Api { status: u16, message: String },
    /// A container was about to be removed but no longer carries the label that allows it.
    #[error("container {0} does not carry the label gpum.managed=true; not touching it")]
    NotManaged(String),
    #[error("Docker error: {0}")]
    Other(String),
}

impl From<bollard::errors::Error> for DockerError {
    fn from(e: bollard::errors::Error) -> Self {
        use bollard::errors::Error as B;
        match e {
            B::SocketNotFoundError(p) => DockerError::Unavailable(format!("socket {p} not found")),
            B::DockerResponseServerError { status_code: 404, message } => DockerError::NotFound(message),
            B::DockerResponseServerError { status_code, message } => {
                DockerError::Api { status: status_code, message }
            }
            B::RequestTimeoutError => DockerError::Unavailable("the engine did not answer in time".into()),
            e @ (B::HyperLegacyError { .. } | B::IOError { .. } | B::HyperResponseError { .. }) => {
                DockerError::Unavailable(e.to_string())
            }
            e => DockerError::Other(e.to_string()),
        }
    }
}

/// A client for one engine. Cheap to share by reference; all methods take `&self`.
#[derive(Debug)]
pub struct Docker {
    socket: PathBuf,
    client: bollard::Docker,
    negotiated: tokio::sync::OnceCell<()>,
    scope: Option<(String, String)>,
}

impl Docker {
    /// A client for the engine at `socket` (default [`DEFAULT_SOCKET`]). Fails with
    /// [`DockerError::Unavailable`] when the socket does not exist; it does not call the engine.
    pub fn connect(socket: Option<&Path>) -> Result<Docker, DockerError> {
        let socket = socket.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        let s = socket.to_string_lossy().into_owned();
        // bollard's own per-request timeout is a backstop only: every call here carries a
        // shorter deadline of its own, and image pulls stream for as long as they need.
        let client = bollard::Docker::connect_with_unix(&s, 3600, bollard::API_DEFAULT_VERSION)?;
        Ok(Docker { socket, client, negotiated: tokio::sync::OnceCell::new(), scope: None })
    }

    /// Scopes this client to the containers carrying `key=value` as well (see the module docs).
    /// For tests only: the key must start with `gpum.test.`.
    #[doc(hidden)]
    pub fn with_test_scope(mut self, key: &str, value: &str) -> Self {
        assert!(key.starts_with(TEST_SCOPE_PREFIX), "a test scope label must start with {TEST_SCOPE_PREFIX}");
        self.scope = Some((key.to_string(), value.to_string()));
        self
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The negotiated bollard client. Negotiation is retried until it succeeds once.
    pub(crate) async fn api(&self) -> Result<&bollard::Docker, DockerError> {
        if !self.socket.exists() {
            return Err(DockerError::Unavailable(format!("socket {} not found", self.socket.display())));
        }
        self.negotiated
            .get_or_try_init(|| async {
                let c = self.client.clone();
                // Clones share the version cell, so negotiating a clone sets it for `client`.
                timed(async move { c.negotiate_version().await.map(|_| ()).map_err(DockerError::from) }).await
            })
            .await?;
        Ok(&self.client)
    }

    /// The engine's version, e.g. `20.10.24+dfsg1`.
    pub async fn version(&self) -> Result<String, DockerError> {
        let api = self.api().await?;
        let v = timed(async { api.version().await.map_err(DockerError::from) }).await?;
        v.version.ok_or_else(|| DockerError::Other("the engine did not say its version".into()))
    }

    /// Whether the engine has a runtime named `nvidia` registered (what `nvidia-ctk runtime
    /// configure --runtime=docker` adds).
    pub async fn has_nvidia_runtime(&self) -> Result<bool, DockerError> {
        let api = self.api().await?;
        let info = timed(async { api.info().await.map_err(DockerError::from) }).await?;
        Ok(info.runtimes.unwrap_or_default().contains_key("nvidia"))
    }

    /// The label filter for `label=true` containers, within the test scope if any.
    pub(crate) fn label_filter(&self, label: &str) -> HashMap<String, Vec<String>> {
        let mut labels = vec![format!("{label}=true")];
        if let Some((k, v)) = &self.scope {
            labels.push(format!("{k}={v}"));
        }
        HashMap::from([("label".to_string(), labels)])
    }

    /// The labels a container this client creates carries: `label=true`, plus the test scope.
    pub(crate) fn labels_for(&self, label: &str) -> HashMap<String, String> {
        let mut m = HashMap::from([(label.to_string(), "true".to_string())]);
        if let Some((k, v)) = &self.scope {
            m.insert(k.clone(), v.clone());
        }
        m
    }

    /// Whether `labels` (of a container about to be touched) carry `label=true` and lie within
    /// the test scope, if any.
    pub(crate) fn carries(&self, labels: &HashMap<String, String>, label: &str) -> bool {
        labels.get(label).map(String::as_str) == Some("true")
            && self.scope.as_ref().is_none_or(|(k, v)| labels.get(k) == Some(v))
    }

    /// Lists containers (running or stopped) carrying `label=true`: `(id, name, state)`.
    pub(crate) async fn list_labelled(
        &self,
        label: &str,
    ) -> Result<Vec<(String, String, String)>, DockerError> {
        let api = self.api().await?;
        let opts =
            ListContainersOptions { all: true, filters: self.label_filter(label), ..Default::default() };
        let list = timed(async { api.list_containers(Some(opts)).await.map_err(DockerError::from) }).await?;
        Ok(list
            .into_iter()
            .filter(|c| self.carries(c.labels.as_ref().unwrap_or(&HashMap::new()), label))
            .filter_map(|c| {
                let id = c.id?;
                let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or_default();
                Some((id, name.trim_start_matches('/').to_string(), c.state.unwrap_or_default()))
            })
            .collect())
    }

    /// Force-removes every container carrying `label=true` (within the scope), re-checking the
    /// label of each right before removing it. `volumes` also removes its anonymous volumes.
    /// Returns the names removed; the first error ends the sweep.
    pub(crate) async fn remove_all_labelled(
        &self,
        label: &str,
        volumes: bool,
    ) -> Result<Vec<String>, DockerError> {
        let mut removed = Vec::new();
        for (id, name, _) in self.list_labelled(label).await? {
            match self.force_remove_if(&id, label, volumes).await {
                Ok(()) => {
                    tracing::info!(container = %name, id = %id, label, "removed container");
                    removed.push(name);
                }
                Err(DockerError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// Force-removes container `id` if, right now, it carries `label=true` (and the scope).
    pub(crate) async fn force_remove_if(
        &self,
        id: &str,
        label: &str,
        volumes: bool,
    ) -> Result<(), DockerError> {
        let api = self.api().await?;
        let info = timed(async { api.inspect_container(id, None).await.map_err(DockerError::from) }).await?;
        let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
        if !self.carries(&labels, label) {
            return Err(DockerError::NotManaged(id.to_string()));
        }
        let opts = RemoveContainerOptions { v: volumes, force: true, link: false };
        timed(async { api.remove_container(id, Some(opts)).await.map_err(DockerError::from) }).await
    }
}

/// Runs a short engine call under [`CALL_TIMEOUT`].
pub(crate) async fn timed<T>(f: impl Future<Output = Result<T, DockerError>>) -> Result<T, DockerError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => {
            Err(DockerError::Unavailable(format!("no answer from the engine in {}s", CALL_TIMEOUT.as_secs())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_socket_is_a_clean_error() {
        let e = Docker::connect(Some(Path::new("/nonexistent/gpum/docker.sock"))).unwrap_err();
        assert!(
            matches!(&e, DockerError::Unavailable(m) if m.contains("/nonexistent/gpum/docker.sock")),
            "{e}"
        );
    }

    #[test]
    fn scope_narrows_filters_and_checks() {
        let d = Docker {
            socket: PathBuf::from("/x"),
            client: bollard::Docker::connect_with_unix("/dev/null", 1, bollard::API_DEFAULT_VERSION).unwrap(),
            negotiated: tokio::sync::OnceCell::new(),
            scope: None,
        }
        .with_test_scope("gpum.test.scope", "t1");
        assert_eq!(d.label_filter(LABEL_MANAGED)["label"], vec!["gpum.managed=true", "gpum.test.scope=t1"]);
        let mut l = HashMap::from([("gpum.managed".to_string(), "true".to_string())]);
        assert!(!d.carries(&l, LABEL_MANAGED), "outside the scope");
        l.insert("gpum.test.scope".into(), "t1".into());
        assert!(d.carries(&l, LABEL_MANAGED));
        l.insert("gpum.managed".into(), "yes".into());
        assert!(!d.carries(&l, LABEL_MANAGED), "only the exact value true counts");
    }

    #[test]
    #[should_panic(expected = "gpum.test.")]
    fn scope_key_must_be_a_test_key() {
        let _ =
            Docker::connect(Some(Path::new("/dev/null"))).unwrap().with_test_scope("gpum.managed", "true");
    }
}
