//! The seam between gpum and the machine it runs on.
//!
//! Every side effect of the installer and the agent goes through this crate: spawning processes,
//! reading and writing files (always under a root path, so tests can use a scratch root), the
//! environment, the clock, the effective uid, and HTTP clients. `clippy.toml` forbids the
//! std equivalents everywhere else, so "the audit changes nothing" and "the agent writes only
//! its own directories" are properties one can check by reading this crate and its callers.
//!
//! [`Host`] is the trait; [`RealHost`] is the machine; [`fake::FakeHost`] is an in-memory
//! machine for unit tests of checks and plans.
#![allow(clippy::disallowed_methods)]

pub mod env;
pub mod fake;
pub mod http;
mod real;

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use real::RealHost;

/// A process to run. The program is looked up in `PATH` unless it is absolute.
///
/// There is deliberately no way to pass extra environment variables: secrets never travel
/// in a child's environment or argv. Secrets go through `stdin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
}

impl Cmd {
    pub fn new(program: impl Into<String>) -> Self {
        Self { program: program.into(), args: Vec::new(), stdin: None }
    }
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn args<I, S>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(it.into_iter().map(Into::into));
        self
    }
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }
    /// The command line as a user would type it, for plans and logs.
    pub fn display(&self) -> String {
        let mut s = self.program.clone();
        for a in &self.args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

/// In an argument of [`Host::run_with_status`]: the number of the status pipe's writing end in
/// the child.
pub const STATUS_FD: &str = "{status_fd}";

/// What a finished process left behind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Free and total space of a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub avail_bytes: u64,
    pub total_bytes: u64,
}

/// The machine, as gpum sees it. Paths are absolute paths *on the target machine*; an
/// implementation maps them under its root.
pub trait Host: Send + Sync {
    /// Runs a process to completion. `Err` means it could not be started (not found, not
    /// executable); a non-zero exit is `Ok` with that code.
    fn run(&self, cmd: &Cmd) -> io::Result<Output>;
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// [`Host::read`] as UTF-8 text ([`utf8`]).
    fn read_to_string(&self, path: &Path) -> io::Result<String>;
    /// The file's bytes, handed to `each` piece by piece, in order: for a large file read once
    /// and scanned (dpkg's status file, most of a megabyte), where holding it whole costs a
    /// fresh page of memory per 4 KiB. The real host reads it through one 64 KiB buffer; the
    /// fake host hands over its file whole.
    fn read_pieces(&self, path: &Path, each: &mut dyn FnMut(&[u8])) -> io::Result<()>;
    /// Reads a file that the kernel makes anew at each read and that is read again and again
    /// (`/proc/meminfo` and `/proc/stat` at every heartbeat). The real host keeps it open after
    /// the first read and reads it from the start with `pread`: one system call when the file
    /// fits its buffer, and no path walk, where [`Host::read`] takes six. Not for ordinary files:
    /// a file replaced on disk would still be read through the old handle. The fake host reads
    /// its file.
    fn read_kept(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The machine's name in its UTS namespace, as `/proc/sys/kernel/hostname` gives it
    /// (trimmed). The real host asks `uname(2)`, one system call where the file's read takes two
    /// and costs ten times more; the fake host and a scratch root read the file
    /// ([`hostname_file`]).
    fn hostname(&self) -> io::Result<String>;
    fn exists(&self, path: &Path) -> bool;
    fn is_dir(&self, path: &Path) -> bool;
    /// Entries of a directory, as absolute target paths, sorted.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// Writes `data` to `path` atomically: a temp file in the same directory created with
    /// `mode` (O_EXCL, so the mode holds from the first byte, whatever the umask), fsync,
    /// rename, fsync of the directory.
    fn write_atomic(&self, path: &Path, data: &[u8], mode: u32) -> io::Result<()>;
    fn create_dir_all(&self, path: &Path, mode: u32) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` onto `to` in one step (`rename(2)`: atomic, replacing `to`; both in one
    /// directory), then fsyncs the directory: the agent's upgrade swaps its binary with it
    /// (issue 47), so that the path holds either the old file or the new, never a mix.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    fn space(&self, path: &Path) -> io::Result<FsSpace>;
    /// A process environment variable; see [`env`] for the names gpum reads.
    fn env(&self, key: &str) -> Option<String>;
    fn euid(&self) -> u32;
    fn now(&self) -> SystemTime;
    /// Time since boot on `CLOCK_MONOTONIC`: it never steps back and, like the kernel's CPU
    /// time counters, it stops while the machine is suspended. The real host reads it from the
    /// vDSO, without a system call; the fake host's moves only with `FakeHost::advance`.
    fn monotonic(&self) -> std::time::Duration;
    /// `uname -m` of the machine.
    fn arch(&self) -> String;
    fn stdin_is_tty(&self) -> bool;
    /// Whether stderr is a terminal, where `gpum-install` draws its progress (a person is
    /// watching); a pipe, a file or `--json` gets line-by-line output only.
    fn stderr_is_tty(&self) -> bool;

    /// Runs a process to completion as [`Host::run`] does, with one more pipe for the status
    /// lines a program writes to a file descriptor it is told the number of (apt's
    /// `APT::Status-Fd`): every [`STATUS_FD`] in the arguments becomes that number, and
    /// `on_line` gets each line written to the pipe (without its newline) while the process
    /// runs. stdout and stderr are collected as [`Host::run`] collects them.
    fn run_with_status(&self, cmd: &Cmd, on_line: &mut dyn FnMut(&str)) -> io::Result<Output>;

    /// Asks a yes/no question on the controlling terminal (`/dev/tty`), which works even when
    /// stdin is the piped install script (`curl … | sudo bash`); the answer defaults to "no".
    /// `Ok(None)` when there is no terminal to ask on; the caller then decides without asking
    /// (it never assumes "yes"). The only way gpum asks a question.
    fn confirm(&self, prompt: &str) -> io::Result<Option<bool>>;

    /// When `path`'s inode last changed (ctime): for an installed program, when it was installed,
    /// since dpkg keeps the package's mtime but cannot keep the ctime.
    fn changed(&self, path: &Path) -> io::Result<SystemTime>;

    /// Waits. The fake host returns at once, so tests of polling loops take no time.
    fn sleep(&self, d: std::time::Duration);

    /// Read-only probe of a POSIX (`fcntl`) lock, the kind dpkg and apt take on
    /// `/var/lib/dpkg/lock*`: the pid of a process holding a lock on `path` that would conflict
    /// with a write lock, `Ok(None)` when none does. Takes no lock and changes nothing.
    fn lock_holder(&self, path: &Path) -> io::Result<Option<i32>>;

    /// Takes an exclusive POSIX (`fcntl`) write lock on `path` without waiting, creating the
    /// file 0600 when it is missing. `Ok(Ok(lock))`: held until `lock` is dropped or the
    /// process ends (even by SIGKILL, so a killed holder never leaves it stuck);
    /// `Ok(Err(pid))`: another process holds it (its pid, 0 when the kernel did not say).
    fn try_lock(&self, path: &Path) -> io::Result<Result<HeldLock, i32>>;

    /// Starts writing `dest` through a partial file beside it, created O_EXCL with `mode`.
    /// Bytes go to disk as they arrive; [`PartialFile::commit`] fsyncs and renames the partial
    /// file onto `dest`; dropping it uncommitted deletes it. So a download can be hashed while it
    /// is written, and be in place only after every check has passed.
    fn create_partial(&self, dest: &Path, mode: u32) -> io::Result<Box<dyn PartialFile>>;

    /// Creates the directory `path` with `mode` (re-applied, so the umask cannot narrow it),
    /// failing with `AlreadyExists` when anything is there already, a symlink included: a
    /// directory someone else prepared is never adopted. The parent must exist.
    fn create_dir_exclusive(&self, path: &Path, mode: u32) -> io::Result<()>;

    /// What `path` itself is (`lstat`: a symlink is reported as one, not followed): its kind,
    /// owner and permission bits.
    fn lstat(&self, path: &Path) -> io::Result<FileStat>;

    /// One `GET` over a Unix socket (the Docker Engine API), HTTP/1.0 so the body ends at EOF.
    /// Bounded by a short timeout so a hung daemon cannot hang the caller.
    fn unix_http_get(&self, socket: &Path, path: &str) -> io::Result<UnixHttpResponse>;
}

/// A lock taken by [`Host::try_lock`], released when dropped.
#[derive(Debug)]
pub struct HeldLock {
    /// The open file that carries the lock (none for the fake host).
    _file: Option<std::fs::File>,
}

impl HeldLock {
    /// The lock of a host whose locks are not the kernel's (the fake host).
    pub fn simulated() -> HeldLock {
        HeldLock { _file: None }
    }

    pub(crate) fn on(file: std::fs::File) -> HeldLock {
        HeldLock { _file: Some(file) }
    }
}

/// What [`Host::lstat`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    /// The owner's uid.
    pub uid: u32,
    /// Permission bits with setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// A file being written under a temporary name; see [`Host::create_partial`].
pub trait PartialFile: Send {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// fsync, rename onto the destination, fsync the directory.
    fn commit(self: Box<Self>) -> io::Result<()>;
}

/// An HTTP/1.0 response read from a Unix socket: status, headers, and the body (which ends at
/// EOF).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnixHttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl UnixHttpResponse {
    /// Parses a whole response as it came off the socket.
    pub fn parse(raw: &[u8]) -> io::Result<Self> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP response");
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(bad)?;
        let head = std::str::from_utf8(&raw[..end]).map_err(|_| bad())?;
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .filter(|l| l.starts_with("HTTP/"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(bad)?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Ok(Self { status, headers, body: raw[end + 4..].to_vec() })
    }

    /// A header's value; names compare case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Errors of the HTTP seam.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("invalid URL {0}")]
    BadUrl(String),
    #[error("plain http:// is allowed only to a loopback address, not {0}")]
    InsecureNonLoopback(String),
    #[error("unsupported URL scheme in {0}")]
    Scheme(String),
    #[error(transparent)]
    Client(#[from] reqwest::Error),
    /// A proxy the environment names that this client cannot use (never its credentials).
    #[error("proxy: {0}")]
    Proxy(String),
    #[error("TLS settings: {0}")]
    Tls(String),
}

/// The hostname as `/proc/sys/kernel/hostname` gives it, trimmed: [`Host::hostname`] where no
/// system call answers for the machine.
pub fn hostname_file<H: Host + ?Sized>(host: &H) -> io::Result<String> {
    Ok(utf8(host.read_kept(Path::new("/proc/sys/kernel/hostname"))?)?.trim().to_string())
}

/// A file's bytes as text, for [`Host::read_to_string`]: bytes that are not UTF-8 are
/// `InvalidData`.
pub fn utf8(b: Vec<u8>) -> io::Result<String> {
    String::from_utf8(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
