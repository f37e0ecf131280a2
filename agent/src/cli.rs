//! The command line. `main` parses, picks the command, runs it, and maps the outcome to an exit
//! code once, at the end. Every command takes `--state DIR`, so tests and owners can run an agent
//! from a scratch directory; without it the system paths are used.

use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use gpum_common::text::Escaped;
use gpum_common::texts::fill;
use gpum_common::{Failure, Lang, detect_lang, exit};
use gpum_host::{Host, RealHost, env};

use crate::config::Paths;
use crate::register::{self, RegisterOptions};
use crate::text::Msg;

#[derive(Debug, Parser)]
#[command(
    name = "gpum-agent",
    version = gpum_enroll::AGENT_VERSION,
    about = "The gpum agent: reports this machine's GPUs to the platform and proves they work in Docker.",
    long_about = None,
)]
pub struct Cli {
    /// Language of messages: ru or en (default: from LC_ALL, LC_MESSAGES, LANG).
    #[arg(long, global = true, value_parser = ["ru", "en"])]
    pub lang: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// The clap definition, for the man page and shell completions `cargo xtask dist` generates.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

#[derive(Debug, Clone, clap::Args)]
pub struct StateArg {
    /// State directory; the config is DIR/config.toml. Default: /var/lib/gpum-agent with
    /// /etc/gpum-agent/config.toml.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Register this machine with a join code read from stdin; writes the config (0600).
    Register {
        #[command(flatten)]
        state: StateArg,
        /// Platform URL (https://…; http:// only to a loopback address).
        #[arg(long, value_name = "URL")]
        server: String,
        /// An extra trusted CA certificate (PEM) for a platform with a private CA.
        #[arg(long, value_name = "FILE")]
        ca_file: Option<PathBuf>,
        /// The Docker socket, when not /var/run/docker.sock.
        #[arg(long, value_name = "PATH")]
        docker_socket: Option<PathBuf>,
        /// A registry the GPU probe's image may come from (repeat for several). Default:
        /// docker.io, nvcr.io, ghcr.io.
        #[arg(long = "probe-registry", value_name = "HOST[:PORT]")]
        probe_registries: Vec<String>,
    },
    /// Write the config for an existing node token, read from the first line of stdin.
    Configure {
        #[command(flatten)]
        state: StateArg,
        #[arg(long, value_name = "URL")]
        server: String,
        /// The node id, for status and logs.
        #[arg(long, value_name = "ID")]
        node_id: Option<String>,
        #[arg(long, value_name = "FILE")]
        ca_file: Option<PathBuf>,
        #[arg(long, value_name = "PATH")]
        docker_socket: Option<PathBuf>,
        /// A registry the GPU probe's image may come from (repeat for several).
        #[arg(long = "probe-registry", value_name = "HOST[:PORT]")]
        probe_registries: Vec<String>,
    },
    /// Run the service (what systemd starts).
    Run {
        #[command(flatten)]
        state: StateArg,
    },
    /// One handshake with the platform: 0 ok, 3 no answer in 10 s, 4 token rejected, 1 else.
    Smoke {
        #[command(flatten)]
        state: StateArg,
    },
    /// Show the connection, last heartbeat, node, verification and why the agent stopped.
    Status {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        json: bool,
    },
    /// Host, runtime, GPU and platform report. Its exit code is not a health verdict.
    Doctor {
        #[command(flatten)]
        state: StateArg,
        /// Only the platform handshake (10 s budget); exits with smoke's codes.
        #[arg(long)]
        connectivity: bool,
        #[arg(long)]
        json: bool,
    },
    /// Remove the service, its files and its containers; Docker, drivers and images stay.
    Uninstall {
        #[command(flatten)]
        state: StateArg,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Print the version.
    Version {
        #[command(flatten)]
        state: StateArg,
    },
    /// The upgrade's rollback guard (issue 47), run by a systemd timer from the previous
    /// binary: puts it back while the upgrade is still pending, and restarts the service.
    #[command(hide = true)]
    Rollback {
        #[command(flatten)]
        state: StateArg,
    },
}

/// Logs go to stderr (journald under systemd), filtered by `GPUM_LOG` (default `info`).
fn init_logging(host: &dyn Host) {
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = host.env(env::GPUM_LOG).filter(|s| !s.is_empty()).unwrap_or_else(|| "info".into());
    let _ = log_subscriber(&filter, std::io::stderr).try_init();
}

/// The agent's log lines, written to `writer`: no colours, no target, and every field's value
/// (the message included) printed through
/// [`escape_controls`](gpum_common::text::escape_controls) ([`EscapedFields`]).
pub fn log_subscriber<W>(filter: &str, writer: W) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(writer)
        .with_ansi(false)
        .with_target(false)
        .fmt_fields(EscapedFields)
        .finish()
}

/// The log lines' fields, each value escaped: shared with the platform (`gpum_common::log`).
pub use gpum_common::log::EscapedFields;

fn runtime() -> tokio::runtime::Runtime {
    // One thread: the agent does little at a time, and every extra worker costs memory.
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

fn first_stdin_line() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    line
}

/// The program. Returns the exit code.
pub fn main() -> i32 {
    let host: Arc<dyn Host> = Arc::new(RealHost::new());
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => exit::OK,
                _ => exit::USAGE,
            };
            let _ = e.print();
            return if matches!(e.kind(), clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
                exit::USAGE
            } else {
                code
            };
        }
    };
    let lang = detect_lang(host.as_ref(), cli.lang.as_deref().and_then(Lang::parse));
    init_logging(host.as_ref());
    match dispatch(host, cli.command, lang) {
        Ok(code) => code,
        Err(f) => gpum_common::report(&f, lang),
    }
}

fn reg_opts(
    state: &StateArg,
    server: String,
    ca_file: Option<PathBuf>,
    docker_socket: Option<PathBuf>,
    probe_registries: Vec<String>,
) -> Result<RegisterOptions, Failure> {
    let paths = Paths::resolve(state.state.as_deref());
    let probe_registries = if probe_registries.is_empty() {
        None
    } else {
        Some(crate::config::check_registries(probe_registries).map_err(Failure::Usage)?)
    };
    Ok(RegisterOptions {
        server,
        config_path: paths.config,
        state_dir: paths.state_dir,
        ca_file: ca_file.map(|p| std::path::absolute(&p).unwrap_or(p)),
        docker_socket,
        probe_registries,
        install_id: None,
    })
}

fn dispatch(host: Arc<dyn Host>, cmd: Command, lang: Lang) -> Result<i32, Failure> {
    match cmd {
        Command::Register { state, server, ca_file, docker_socket, probe_registries } => {
            let opts = reg_opts(&state, server, ca_file, docker_socket, probe_registries)?;
            let code = first_stdin_line();
            let h = host.clone();
            let engine = crate::run::docker_version(h.as_ref(), opts.docker_socket.as_deref());
            let r = runtime().block_on(register::register(host, &opts, &code, engine))?;
            let node = Escaped(&r.node_id).to_string();
            let config = Escaped(&opts.config_path.display().to_string()).to_string();
            println!("{}", fill(Msg::Registered.text(lang), &[("node", &node), ("config", &config)]));
            Ok(exit::OK)
        }
        Command::Configure { state, server, node_id, ca_file, docker_socket, probe_registries } => {
            let opts = reg_opts(&state, server, ca_file, docker_socket, probe_registries)?;
            let mut input = String::new();
            let _ = std::io::stdin().lock().take(64 * 1024).read_to_string(&mut input);
            register::configure(host.as_ref(), &opts, node_id.as_deref(), &input)?;
            println!("{}", Escaped(&opts.config_path.display().to_string()));
            Ok(exit::OK)
        }
        Command::Run { state } => {
            let paths = Paths::resolve(state.state.as_deref());
            Ok(runtime().block_on(crate::run::run(host, &paths)))
        }
        Command::Smoke { state } => {
            let paths = Paths::resolve(state.state.as_deref());
            let hs = runtime().block_on(crate::smoke::handshake(host, &paths));
            // The detail can quote the platform's (or a proxy's) words: escaped.
            let detail = Escaped(&hs.detail).to_string();
            if hs.code == exit::OK {
                println!("{}", fill(Msg::SmokeOk.text(lang), &[("detail", &detail)]));
            } else {
                let code = hs.code.to_string();
                eprintln!("{}", fill(Msg::SmokeFailed.text(lang), &[("code", &code), ("detail", &detail)]));
            }
            Ok(hs.code)
        }
        Command::Status { state, json } => {
            let paths = Paths::resolve(state.state.as_deref());
            let st = crate::status::load(host.as_ref(), &paths)?;
            let now = crate::state::unix(host.now());
            let q = crate::status::quarantine(host.as_ref(), &paths, now);
            let up = gpum_common::agent_state::read_upgrade(host.as_ref(), &paths.state_dir).ok().flatten();
            if json {
                let mut v: serde_json::Value =
                    serde_json::from_str(&crate::status::render_json(st.as_ref(), q.as_ref(), lang))
                        .expect("json");
                if let Some(u) = &up {
                    v["upgrade"] = serde_json::to_value(u).expect("json");
                }
                println!("{}", serde_json::to_string_pretty(&v).expect("json"));
            } else {
                print!("{}", crate::status::render_text(st.as_ref(), q.as_ref(), now, lang));
                if st.is_some()
                    && let Some(u) = &up
                {
                    print!("{}", crate::status::upgrade_line(u, now, lang));
                }
            }
            Ok(exit::OK)
        }
        Command::Doctor { state, connectivity, json } => {
            let paths = Paths::resolve(state.state.as_deref());
            let r = runtime().block_on(crate::doctor::report(host, &paths, connectivity, lang));
            if json {
                println!("{}", serde_json::to_string_pretty(&r).expect("json"));
            } else {
                print!("{}", crate::doctor::render_text(&r, lang));
            }
            // The full report is something to read, not a verdict; the connectivity check is.
            Ok(if connectivity { r.platform.handshake_exit } else { exit::OK })
        }
        Command::Uninstall { state: _, yes } => {
            let rt = runtime();
            rt.block_on(async {
                let cfg = crate::config::Config::load(host.as_ref(), &Paths::resolve(None).config).ok();
                let socket = crate::run::docker_socket(
                    host.as_ref(),
                    cfg.as_ref().and_then(|c| c.docker_socket.as_deref()),
                );
                let docker = crate::docker::Docker::connect(socket.as_deref());
                Ok(crate::uninstall::run(host.as_ref(), yes, docker, lang).await)
            })
        }
        Command::Version { .. } => {
            println!("gpum-agent {}", gpum_enroll::AGENT_VERSION);
            Ok(exit::OK)
        }
        Command::Rollback { state } => {
            let paths = Paths::resolve(state.state.as_deref());
            Ok(crate::upgrade::rollback(host.as_ref(), &crate::upgrade::Layout::installed(&paths.state_dir)))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what the subscriber wrote.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Buf {
        type Writer = Buf;
        fn make_writer(&'w self) -> Buf {
            self.clone()
        }
    }

    /// Issue 29, item 7: text from the platform in a log field, written with `%` or `?`, and in
    /// the message itself, reaches the log with its control characters escaped.
    #[test]
    fn log_lines_escape_control_characters_in_every_field() {
        let buf = Buf::default();
        let sub = super::log_subscriber("info", buf.clone());
        let image = "evil\x1b]0;owned\x07@sha256:\x1b[2J";
        let id = String::from("cmd\r\nFAKE: agent stopped\u{9b}31m");
        tracing::subscriber::with_default(sub, || {
            tracing::info!(image = %image, "probe image set by the platform");
            tracing::warn!(id = ?id, kind = %"x\u{202e}y", "refused an unknown command");
            tracing::info!("pull: {}", "Downloading\x1b[1A");
            tracing::info!(count = 3u64, ok = true, "plain fields stay plain");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(!out.contains('\u{202e}'), "{out:?}");
        assert!(lines[0].contains("image=evil\\x1b]0;owned\\x07@sha256:\\x1b[2J"), "{}", lines[0]);
        assert!(lines[0].contains("probe image set by the platform"), "{}", lines[0]);
        // Debug already escapes a string's controls; its backslashes are doubled once more, so
        // that no value can spell an escape that was not there.
        assert!(lines[1].contains(r#"id="cmd\\r\\nFAKE: agent stopped\\u{9b}31m""#), "{}", lines[1]);
        assert!(lines[1].contains("kind=x\\u{202e}y"), "{}", lines[1]);
        assert!(lines[2].ends_with("pull: Downloading\\x1b[1A"), "{}", lines[2]);
        assert!(lines[3].ends_with("plain fields stay plain count=3 ok=true"), "{}", lines[3]);
    }
}
