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
//! client with the hidden `Docker::with_test_scope`, which adds one more label (key under
//! `gpum.test.`) to every container the client creates and to every label filter it lists
//! with, so one test never sees another's containers. It exists only in a build with the
//! `test-knobs` feature (and in unit tests); release builds lack it.

pub mod address;
pub mod gpucheck;
pub mod image;
pub mod ledger;
pub mod probe;
pub mod reconcile;
pub mod rental;
pub mod watch;

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
/// The probe's second label: which agent run created it (random per run, so no image can know
/// it in advance).
pub const LABEL_PROBE_RUN: &str = "gpum.probe.run";
/// Every probe container's name starts with this.
pub const PROBE_NAME_PREFIX: &str = "gpum-probe-";
/// The deadline of every short engine call (list, inspect, stop, remove, info, version).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The prefix a test scope label key must carry.
#[cfg(any(test, feature = "test-knobs"))]
const TEST_SCOPE_PREFIX: &str = "gpum.test.";
/// Image ids whose labels were looked up, kept at most this many (an id's labels never change:
/// the id is the hash of the image's config, labels included).
const IMAGE_CACHE_MAX: usize = 1024;

/// How long an idle connection to the engine is kept for the next call: nine heartbeats at the
/// usual 10 s interval. A connection kept longer than that is dropped and a new one opened.
const ENGINE_IDLE: Duration = Duration::from_secs(90);
/// Idle connections kept to the engine: the heartbeat's list, and one for a probe or a removal
/// running beside it.
const ENGINE_IDLE_MAX: usize = 2;

/// A bollard client for the engine's Unix socket that keeps its connection between calls.
///
/// bollard's own Unix client (`connect_with_unix`) keeps no idle connection, so every call paid
/// a new connection (`socket`, `connect`, two `epoll_ctl`, `shutdown`, `close`, and the engine's
/// side of each) every heartbeat. This is the same hyper client on the same connector
/// (`hyperlocal`, the URI's host being the socket's path in hex, as bollard writes it) with
/// idle connections kept. A connection the engine closed while idle (a restart) is not reused:
/// hyper drops it from the pool when it sees the close, and retries a request that was not yet
/// written on a new one.
fn engine_client(socket: &Path) -> Result<bollard::Docker, DockerError> {
    if !socket.exists() {
        return Err(bollard::errors::Error::SocketNotFoundError(socket.display().to_string()).into());
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(ENGINE_IDLE_MAX)
        .pool_idle_timeout(ENGINE_IDLE)
        .build(hyperlocal::UnixConnector);
    let base: hyper::Uri = hyperlocal::Uri::new(socket, "/").into();
    let host = base.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
    let transport = move |req: bollard::BollardRequest| {
        let client = client.clone();
        async move { client.request(req).await.map_err(|err| bollard::errors::Error::HyperLegacyError { err }) }
    };
    // bollard's own per-request timeout is a backstop only: every call here carries a shorter
    // deadline of its own, and image pulls stream for as long as they need.
    Ok(bollard::Docker::connect_with_custom_transport(
        transport,
        Some(format!("unix://{host}")),
        3600,
        bollard::API_DEFAULT_VERSION,
    )?)
}

/// What makes a container gpum's: a label set to `true` on the container itself (not inherited
/// from its image), plus, for probes, a second label and a name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The label that must be `true`.
    pub label: &'static str,
    /// Further labels that must be present with a non-empty value.
    pub also: &'static [&'static str],
    /// What the container's name must start with, if anything.
    pub name_prefix: Option<&'static str>,
}

/// Containers the platform asked for: `gpum.managed=true`, set on the container.
pub const MANAGED: Mark = Mark { label: LABEL_MANAGED, also: &[], name_prefix: None };
/// The agent's probes: `gpum.probe=true` and `gpum.probe.run=<id>`, both set on the container,
/// and a name starting `gpum-probe-`.
pub const PROBE: Mark =
    Mark { label: LABEL_PROBE, also: &[LABEL_PROBE_RUN], name_prefix: Some(PROBE_NAME_PREFIX) };

impl Mark {
    /// Every label key this mark reads; none of them may come from the image.
    fn keys(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.label).chain(self.also.iter().copied())
    }
}

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
    /// A container was about to be removed but does not carry gpum's label on the container
    /// itself (absent, or inherited from its image).
    #[error(
        "container {0} is not gpum's (its gpum label is absent or comes from its image); not touching it"
    )]
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
    /// Per image id, the `gpum.*` label keys its config carries (see [`IMAGE_CACHE_MAX`]).
    image_gpum_keys: std::sync::Mutex<HashMap<String, Vec<String>>>,
}

impl Docker {
    /// A client for the engine at `socket` (default [`DEFAULT_SOCKET`]). Fails with
    /// [`DockerError::Unavailable`] when the socket does not exist; it does not call the engine.
    pub fn connect(socket: Option<&Path>) -> Result<Docker, DockerError> {
        let socket = socket.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        let client = engine_client(&socket)?;
        Ok(Docker {
            socket,
            client,
            negotiated: tokio::sync::OnceCell::new(),
            scope: None,
            image_gpum_keys: Default::default(),
        })
    }

    /// Scopes this client to the containers carrying `key=value` as well (see the module docs).
    /// For tests only (`test-knobs`): the key must start with `gpum.test.`.
    #[cfg(any(test, feature = "test-knobs"))]
    #[doc(hidden)]
    pub fn with_test_scope(mut self, key: &str, value: &str) -> Self {
        assert!(key.starts_with(TEST_SCOPE_PREFIX), "a test scope label must start with {TEST_SCOPE_PREFIX}");
        self.scope = Some((key.to_string(), value.to_string()));
        self
    }

    /// Whether this client is narrowed to a test scope: then what is the whole machine's (the
    /// rentals' network, the egress table) is not this client's to remove. Always false in a
    /// release build.
    pub fn is_test_scoped(&self) -> bool {
        self.scope.is_some()
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

    /// The engine-side filter for `mark`'s label, within the test scope if any. The engine
    /// filters on the merged labels, so this only narrows the list; [`Docker::is_marked`]
    /// decides.
    pub(crate) fn label_filter(&self, mark: Mark) -> HashMap<String, Vec<String>> {
        let mut labels = vec![format!("{}=true", mark.label)];
        if let Some((k, v)) = &self.scope {
            labels.push(format!("{k}={v}"));
        }
        HashMap::from([("label".to_string(), labels)])
    }

    /// The labels a container this client creates carries: `label=true`, `extra`, plus the test
    /// scope.
    pub(crate) fn labels_for(&self, label: &str, extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m = HashMap::from([(label.to_string(), "true".to_string())]);
        m.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        if let Some((k, v)) = &self.scope {
            m.insert(k.clone(), v.clone());
        }
        m
    }

    /// Whether a container's merged `labels` and `name` carry `mark` (and lie within the test
    /// scope, if any), leaving aside where the labels came from. Pure.
    pub(crate) fn carries(&self, labels: &HashMap<String, String>, name: &str, mark: Mark) -> bool {
        labels.get(mark.label).map(String::as_str) == Some("true")
            && mark.also.iter().all(|k| labels.get(*k).is_some_and(|v| !v.is_empty()))
            && mark.name_prefix.is_none_or(|p| name.trim_start_matches('/').starts_with(p))
            && self.scope.as_ref().is_none_or(|(k, v)| labels.get(k) == Some(v))
    }

    /// Whether the container carries `mark` and none of the mark's labels could have come from
    /// its image. The engine merges an image's labels into every container made from it, so
    /// a label the image's config has (whatever its value) is no proof that gpum set it: an
    /// owner's container from an image labelled `gpum.managed=true` is the owner's.
    pub(crate) async fn is_marked(
        &self,
        labels: &HashMap<String, String>,
        name: &str,
        image_id: &str,
        mark: Mark,
    ) -> Result<bool, DockerError> {
        if !self.carries(labels, name, mark) {
            return Ok(false);
        }
        let from_image = self.image_gpum_keys(image_id).await?;
        Ok(!mark.keys().any(|k| from_image.iter().any(|i| i == k)))
    }

    /// The `gpum.*` label keys of image `image_id`'s config. An image that cannot be read
    /// proves nothing: the error goes to the caller, which then leaves the container alone.
    async fn image_gpum_keys(&self, image_id: &str) -> Result<Vec<String>, DockerError> {
        if image_id.is_empty() {
            return Err(DockerError::Other("the engine did not say which image the container runs".into()));
        }
        if let Some(k) = self.image_gpum_keys.lock().unwrap_or_else(|e| e.into_inner()).get(image_id) {
            return Ok(k.clone());
        }
        let api = self.api().await?;
        let info = timed(async { api.inspect_image(image_id).await.map_err(DockerError::from) }).await?;
        let keys: Vec<String> = info
            .config
            .and_then(|c| c.labels)
            .unwrap_or_default()
            .into_keys()
            .filter(|k| k.starts_with("gpum."))
            .collect();
        // Only an image whose id is the one asked for is cached: ids are content hashes, so its
        // labels never change.
        if info.id.as_deref() == Some(image_id) {
            let mut cache = self.image_gpum_keys.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= IMAGE_CACHE_MAX {
                cache.clear();
            }
            cache.insert(image_id.to_string(), keys.clone());
        }
        Ok(keys)
    }

    /// Lists the containers (running or stopped) that carry `mark`: `(id, name, state)`.
    /// A container whose image cannot be read is left out (logged): it cannot be shown to be
    /// gpum's.
    pub(crate) async fn list_marked(&self, mark: Mark) -> Result<Vec<(String, String, String)>, DockerError> {
        let api = self.api().await?;
        let opts =
            ListContainersOptions { all: true, filters: self.label_filter(mark), ..Default::default() };
        let list = timed(async { api.list_containers(Some(opts)).await.map_err(DockerError::from) }).await?;
        let mut out = Vec::new();
        for c in list {
            let Some(id) = c.id else { continue };
            let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or_default();
            let name = name.trim_start_matches('/').to_string();
            let labels = c.labels.unwrap_or_default();
            match self.is_marked(&labels, &name, c.image_id.as_deref().unwrap_or(""), mark).await {
                Ok(true) => out.push((id, name, c.state.unwrap_or_default())),
                Ok(false) => {}
                Err(e @ DockerError::Unavailable(_)) => return Err(e),
                Err(e) => {
                    tracing::debug!(container = %name, id = %id, error = %e, "cannot read the container's image; not treating it as gpum's")
                }
            }
        }
        Ok(out)
    }

    /// Force-removes every container carrying `mark` (within the scope), re-checking each right
    /// before removing it. `volumes` also removes its anonymous volumes. Returns the names
    /// removed; the first error ends the sweep.
    pub(crate) async fn remove_all_marked(
        &self,
        mark: Mark,
        volumes: bool,
    ) -> Result<Vec<String>, DockerError> {
        let mut removed = Vec::new();
        for (id, name, _) in self.list_marked(mark).await? {
            match self.force_remove_if(&id, mark, volumes).await {
                Ok(()) => {
                    tracing::info!(container = %name, id = %id, label = mark.label, "removed container");
                    removed.push(name);
                }
                Err(DockerError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// Errs with [`DockerError::NotManaged`] unless container `id`, as the engine describes it
    /// now, carries `mark` on the container itself.
    pub(crate) async fn check_marked(&self, id: &str, mark: Mark) -> Result<(), DockerError> {
        let api = self.api().await?;
        let info = timed(async { api.inspect_container(id, None).await.map_err(DockerError::from) }).await?;
        let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
        let name = info.name.unwrap_or_default();
        let image = info.image.unwrap_or_default();
        match self.is_marked(&labels, &name, &image, mark).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(id, label = mark.label, "refusing to touch a container that is not gpum's");
                Err(DockerError::NotManaged(id.to_string()))
            }
            Err(e @ DockerError::Unavailable(_)) => Err(e),
            Err(e) => {
                tracing::warn!(id, error = %e, "refusing to touch a container whose image cannot be read");
                Err(DockerError::NotManaged(id.to_string()))
            }
        }
    }

    /// Force-removes container `id` if, right now, it carries `mark` (and the scope).
    pub(crate) async fn force_remove_if(
        &self,
        id: &str,
        mark: Mark,
        volumes: bool,
    ) -> Result<(), DockerError> {
        self.check_marked(id, mark).await?;
        let api = self.api().await?;
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

    fn unconnected() -> Docker {
        Docker {
            socket: PathBuf::from("/x"),
            client: bollard::Docker::connect_with_unix("/dev/null", 1, bollard::API_DEFAULT_VERSION).unwrap(),
            negotiated: tokio::sync::OnceCell::new(),
            scope: None,
            image_gpum_keys: Default::default(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn scope_narrows_filters_and_checks() {
        let d = unconnected().with_test_scope("gpum.test.scope", "t1");
        assert_eq!(d.label_filter(MANAGED)["label"], vec!["gpum.managed=true", "gpum.test.scope=t1"]);
        let mut l = labels(&[("gpum.managed", "true")]);
        assert!(!d.carries(&l, "x", MANAGED), "outside the scope");
        l.insert("gpum.test.scope".into(), "t1".into());
        assert!(d.carries(&l, "x", MANAGED));
        l.insert("gpum.managed".into(), "yes".into());
        assert!(!d.carries(&l, "x", MANAGED), "only the exact value true counts");
    }

    #[test]
    fn a_probe_needs_both_labels_and_its_name_prefix() {
        let d = unconnected();
        let both = labels(&[("gpum.probe", "true"), ("gpum.probe.run", "0123abcd")]);
        assert!(d.carries(&both, "/gpum-probe-00ff", PROBE));
        assert!(!d.carries(&both, "owners-probe", PROBE), "name prefix");
        assert!(
            !d.carries(&labels(&[("gpum.probe", "true")]), "gpum-probe-1", PROBE),
            "one label is not enough"
        );
        assert!(!d.carries(
            &labels(&[("gpum.probe", "true"), ("gpum.probe.run", "")]),
            "gpum-probe-1",
            PROBE
        ));
        assert_eq!(
            d.labels_for(LABEL_PROBE, &[(LABEL_PROBE_RUN, "r1")]),
            labels(&[("gpum.probe", "true"), ("gpum.probe.run", "r1")])
        );
    }

    #[tokio::test]
    async fn an_image_label_is_no_proof() {
        let d = unconnected();
        let managed = labels(&[("gpum.managed", "true")]);
        // The image's keys, as the engine would have answered them (no engine here).
        for (image_keys, want) in [
            (vec![], true),
            (vec!["gpum.managed"], false),
            (vec!["gpum.probe"], true),
            (vec!["gpum.managed", "gpum.other"], false),
        ] {
            let id = format!("sha256:{}", image_keys.join("+"));
            d.image_gpum_keys
                .lock()
                .unwrap()
                .insert(id.clone(), image_keys.iter().map(|s| s.to_string()).collect());
            assert_eq!(d.is_marked(&managed, "c", &id, MANAGED).await.unwrap(), want, "{image_keys:?}");
        }
        let probe = labels(&[("gpum.probe", "true"), ("gpum.probe.run", "r")]);
        d.image_gpum_keys.lock().unwrap().insert("sha256:run".into(), vec!["gpum.probe.run".into()]);
        assert!(
            !d.is_marked(&probe, "gpum-probe-1", "sha256:run", PROBE).await.unwrap(),
            "second label inherited"
        );
        // Without an image id the container cannot be shown to be gpum's.
        assert!(d.is_marked(&managed, "c", "", MANAGED).await.is_err());
    }

    #[test]
    #[should_panic(expected = "gpum.test.")]
    fn scope_key_must_be_a_test_key() {
        let _ =
            Docker::connect(Some(Path::new("/dev/null"))).unwrap().with_test_scope("gpum.managed", "true");
    }
}
