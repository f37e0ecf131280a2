//! An in-memory machine for unit tests: files, command answers, env, uid, clock.
//!
//! It records every command it was asked to run and every write, so a test can assert that a
//! dry run wrote nothing and ran only read-only probes. It keeps each written file's mode and
//! change time, so [`FakeHost::tree`] is the whole file tree as a real machine would show it.
//!
//! Commands do nothing but answer: what a command would change on a real machine is up to the
//! test (an answer, or a host that wraps this one).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::{Cmd, FileKind, FileStat, FsSpace, Host, Output, UnixHttpResponse};

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<PathBuf, Vec<u8>>,
    dirs: Vec<PathBuf>,
    commands: BTreeMap<String, io::Result<Output>>,
    ran: Vec<Cmd>,
    reads: Vec<PathBuf>,
    writes: Vec<PathBuf>,
    env: BTreeMap<String, String>,
    space: BTreeMap<PathBuf, FsSpace>,
    locks: BTreeMap<PathBuf, i32>,
    unix_http: BTreeMap<(PathBuf, String), Vec<u8>>,
    /// What `lstat` reports where a test or `create_dir_exclusive` said so.
    stats: BTreeMap<PathBuf, FileStat>,
    /// The permission bits each file or directory was written with (`write_atomic`, a
    /// partial file's commit, `create_dir_all`'s last directory); [`FakeHost::tree`] and
    /// `lstat` report them.
    modes: BTreeMap<PathBuf, u32>,
    /// When each path last changed ([`Host::changed`]): set by every write, or by a test.
    ctimes: BTreeMap<PathBuf, SystemTime>,
    /// What [`Host::monotonic`] reads; a test moves it with [`FakeHost::advance`].
    monotonic: Duration,
    /// The lines a command writes to its status pipe ([`Host::run_with_status`]), by command
    /// line; see [`FakeHost::status_lines`].
    status: BTreeMap<String, Vec<String>>,
}

impl State {
    /// What `lstat` reports for `path`; see [`FakeHost::stat`].
    fn stat(&self, path: &Path) -> Option<FileStat> {
        let mode = |default| self.modes.get(path).copied().unwrap_or(default);
        if let Some(s) = self.stats.get(path) {
            Some(*s)
        } else if self.dirs.iter().any(|d| d == path) {
            Some(FileStat { kind: FileKind::Dir, uid: 0, mode: mode(0o755) })
        } else if self.files.contains_key(path) {
            Some(FileStat { kind: FileKind::File, uid: 0, mode: mode(0o644) })
        } else if self.files.keys().chain(&self.dirs).chain(self.stats.keys()).any(|p| p.starts_with(path)) {
            // A directory above a known path, as `/var` is above `/var/tmp`.
            Some(FileStat { kind: FileKind::Dir, uid: 0, mode: 0o755 })
        } else {
            None
        }
    }

    /// A write of `path` with `mode` at `now`.
    fn wrote(&mut self, path: &Path, mode: u32, now: SystemTime) {
        self.writes.push(path.to_path_buf());
        self.modes.insert(path.to_path_buf(), mode);
        self.ctimes.insert(path.to_path_buf(), now);
    }

    /// `path` and everything under it are gone.
    fn forget(&mut self, path: &Path) {
        self.modes.retain(|p, _| !p.starts_with(path));
        self.ctimes.retain(|p, _| !p.starts_with(path));
    }
}

/// One entry of [`FakeHost::tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct FakeHost {
    st: Arc<Mutex<State>>,
    pub euid: u32,
    pub arch: String,
    pub now: SystemTime,
    pub tty: bool,
    /// What [`Host::stderr_is_tty`] answers.
    pub stderr_tty: bool,
    /// What [`Host::confirm`] answers: `None` is "no terminal".
    pub answer: Option<bool>,
}

impl Default for FakeHost {
    fn default() -> Self {
        Self {
            st: Arc::new(Mutex::new(State { monotonic: Duration::from_secs(1000), ..State::default() })),
            euid: 0,
            arch: "x86_64".into(),
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            tty: false,
            stderr_tty: false,
            answer: None,
        }
    }
}

fn clone_res(r: &io::Result<Output>) -> io::Result<Output> {
    match r {
        Ok(o) => Ok(o.clone()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

impl FakeHost {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn file(self, path: impl Into<PathBuf>, data: impl Into<Vec<u8>>) -> Self {
        let p = path.into();
        {
            let mut st = self.st.lock().unwrap();
            let mut parent = p.parent();
            while let Some(d) = parent {
                if !st.dirs.iter().any(|x| x == d) {
                    st.dirs.push(d.to_path_buf());
                }
                parent = d.parent();
            }
            st.files.insert(p, data.into());
        }
        self
    }
    pub fn dir(self, path: impl Into<PathBuf>) -> Self {
        self.st.lock().unwrap().dirs.push(path.into());
        self
    }
    /// The answer to a command, keyed by its display form (`program arg arg`).
    pub fn command(self, line: &str, out: io::Result<Output>) -> Self {
        self.st.lock().unwrap().commands.insert(line.to_string(), out);
        self
    }
    /// Shorthand: a command that exits 0 with this stdout.
    pub fn command_ok(self, line: &str, stdout: &str) -> Self {
        self.command(line, Ok(Output { code: Some(0), stdout: stdout.as_bytes().to_vec(), stderr: vec![] }))
    }
    /// The lines `line` writes to its status pipe when run with [`Host::run_with_status`],
    /// where the fake's pipe is descriptor 3 (`line` says `3` where the command has
    /// [`crate::STATUS_FD`]). Its answer is [`FakeHost::command`]'s.
    pub fn status_lines(self, line: &str, lines: &[&str]) -> Self {
        let lines = lines.iter().map(|l| l.to_string()).collect();
        self.st.lock().unwrap().status.insert(line.to_string(), lines);
        self
    }
    pub fn env_var(self, k: &str, v: &str) -> Self {
        self.st.lock().unwrap().env.insert(k.into(), v.into());
        self
    }
    pub fn space_at(self, path: impl Into<PathBuf>, avail_bytes: u64) -> Self {
        self.st
            .lock()
            .unwrap()
            .space
            .insert(path.into(), FsSpace { avail_bytes, total_bytes: avail_bytes * 2 });
        self
    }
    pub fn with_euid(mut self, uid: u32) -> Self {
        self.euid = uid;
        self
    }
    pub fn with_arch(mut self, arch: &str) -> Self {
        self.arch = arch.into();
        self
    }
    /// A process (`pid`) holds a POSIX lock on `path` (see [`Host::lock_holder`]).
    pub fn lock_held(self, path: impl Into<PathBuf>, pid: i32) -> Self {
        self.st.lock().unwrap().locks.insert(path.into(), pid);
        self
    }
    /// The answer to `GET path` on a Unix socket (see [`Host::unix_http_get`]): a whole raw
    /// HTTP response, as captured. Sockets with no answer refuse the connection.
    pub fn unix_http(self, socket: impl Into<PathBuf>, path: &str, raw_response: impl Into<Vec<u8>>) -> Self {
        self.st.lock().unwrap().unix_http.insert((socket.into(), path.to_string()), raw_response.into());
        self
    }
    /// What [`Host::lstat`] reports for `path` (a symlink, another user's directory…). The
    /// path then exists. Without it, a known directory, or a directory above any known path,
    /// is root's, with the mode it was written with or 0755, and a file root's, with the mode it
    /// was written with or 0644.
    pub fn stat(self, path: impl Into<PathBuf>, st: FileStat) -> Self {
        let path = path.into();
        let mut state = self.st.lock().unwrap();
        if st.kind == FileKind::Dir {
            state.dirs.push(path.clone());
        }
        state.stats.insert(path, st);
        drop(state);
        self
    }
    /// When `path` last changed, as [`Host::changed`] reports it. Without it, a file the test
    /// put there changed at the epoch (long before anything ran), and one written since at
    /// [`FakeHost::now`].
    pub fn changed_at(self, path: impl Into<PathBuf>, at: SystemTime) -> Self {
        self.st.lock().unwrap().ctimes.insert(path.into(), at);
        self
    }
    /// Moves the monotonic clock ([`Host::monotonic`]) on by `d`; it starts at 1,000 s.
    pub fn advance(&self, d: Duration) {
        let mut st = self.st.lock().unwrap();
        st.monotonic += d;
    }
    /// Every command run so far.
    pub fn ran(&self) -> Vec<Cmd> {
        self.st.lock().unwrap().ran.clone()
    }
    /// Every path whose contents were read so far (found or not), so a test can prove that a
    /// file holding a secret was never opened.
    pub fn reads(&self) -> Vec<PathBuf> {
        self.st.lock().unwrap().reads.clone()
    }
    /// Every path written or removed so far.
    pub fn writes(&self) -> Vec<PathBuf> {
        self.st.lock().unwrap().writes.clone()
    }
    /// The whole file tree: every directory and file with its mode, and each file's contents.
    pub fn tree(&self) -> BTreeMap<PathBuf, Node> {
        let st = self.st.lock().unwrap();
        let mode = |p: &Path| st.stat(p).map_or(0, |s| s.mode);
        let dirs = st.dirs.iter().map(|d| (d.clone(), Node::Dir { mode: mode(d) }));
        let files =
            st.files.iter().map(|(p, data)| (p.clone(), Node::File { mode: mode(p), data: data.clone() }));
        dirs.chain(files).collect()
    }
}

impl Host for FakeHost {
    fn run(&self, cmd: &Cmd) -> io::Result<Output> {
        let mut st = self.st.lock().unwrap();
        st.ran.push(cmd.clone());
        match st.commands.get(&cmd.display()) {
            Some(r) => clone_res(r),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("{}: not found", cmd.program))),
        }
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut st = self.st.lock().unwrap();
        st.reads.push(path.to_path_buf());
        st.files
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        crate::utf8(self.read(path)?)
    }
    fn read_pieces(&self, path: &Path, each: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        each(&self.read(path)?);
        Ok(())
    }
    fn read_kept(&self, path: &Path) -> io::Result<Vec<u8>> {
        // Nothing to keep open: each read is the file as it is now, as a kernel file's is.
        self.read(path)
    }
    fn hostname(&self) -> io::Result<String> {
        crate::hostname_file(self)
    }
    fn exists(&self, path: &Path) -> bool {
        let st = self.st.lock().unwrap();
        st.files.contains_key(path) || st.dirs.iter().any(|d| d == path) || st.stats.contains_key(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.st.lock().unwrap().dirs.iter().any(|d| d == path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let st = self.st.lock().unwrap();
        if !st.dirs.iter().any(|d| d == path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, path.display().to_string()));
        }
        let mut v: Vec<PathBuf> =
            st.files.keys().chain(st.dirs.iter()).filter(|p| p.parent() == Some(path)).cloned().collect();
        v.sort();
        v.dedup();
        Ok(v)
    }
    fn write_atomic(&self, path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        st.wrote(path, mode, self.now);
        st.files.insert(path.to_path_buf(), data.to_vec());
        Ok(())
    }
    fn create_dir_all(&self, path: &Path, mode: u32) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        // As on the real host, the mode is (re)applied to the last directory only.
        st.wrote(path, mode, self.now);
        if !st.dirs.iter().any(|d| d == path) {
            st.dirs.push(path.to_path_buf());
        }
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        st.writes.push(path.to_path_buf());
        st.modes.remove(path);
        st.ctimes.remove(path);
        st.files
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        let data = st
            .files
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.display().to_string()))?;
        let mode = st.modes.remove(from);
        st.ctimes.remove(from);
        st.writes.push(from.to_path_buf());
        st.wrote(to, mode.unwrap_or(0o644), self.now);
        st.files.insert(to.to_path_buf(), data);
        Ok(())
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        st.writes.push(path.to_path_buf());
        st.files.retain(|p, _| !p.starts_with(path));
        st.dirs.retain(|p| !p.starts_with(path));
        st.stats.retain(|p, _| !p.starts_with(path));
        st.forget(path);
        Ok(())
    }
    fn space(&self, path: &Path) -> io::Result<FsSpace> {
        let st = self.st.lock().unwrap();
        st.space
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }
    fn env(&self, key: &str) -> Option<String> {
        self.st.lock().unwrap().env.get(key).cloned()
    }
    fn euid(&self) -> u32 {
        self.euid
    }
    fn now(&self) -> SystemTime {
        self.now
    }
    fn monotonic(&self) -> Duration {
        self.st.lock().unwrap().monotonic
    }
    fn arch(&self) -> String {
        self.arch.clone()
    }
    fn confirm(&self, _prompt: &str) -> io::Result<Option<bool>> {
        Ok(self.answer)
    }
    fn changed(&self, path: &Path) -> io::Result<SystemTime> {
        let st = self.st.lock().unwrap();
        match st.ctimes.get(path) {
            Some(t) => Ok(*t),
            None if st.stat(path).is_some() => Ok(SystemTime::UNIX_EPOCH),
            None => Err(io::Error::new(io::ErrorKind::NotFound, path.display().to_string())),
        }
    }
    fn sleep(&self, _d: Duration) {}
    fn stdin_is_tty(&self) -> bool {
        self.tty
    }
    fn stderr_is_tty(&self) -> bool {
        self.stderr_tty
    }
    fn run_with_status(&self, cmd: &Cmd, on_line: &mut dyn FnMut(&str)) -> io::Result<Output> {
        let cmd =
            Cmd { args: cmd.args.iter().map(|a| a.replace(crate::STATUS_FD, "3")).collect(), ..cmd.clone() };
        let lines = self.st.lock().unwrap().status.get(&cmd.display()).cloned().unwrap_or_default();
        let out = self.run(&cmd);
        if out.is_ok() {
            for l in &lines {
                on_line(l);
            }
        }
        out
    }
    fn lock_holder(&self, path: &Path) -> io::Result<Option<i32>> {
        Ok(self.st.lock().unwrap().locks.get(path).copied())
    }
    fn try_lock(&self, path: &Path) -> io::Result<Result<crate::HeldLock, i32>> {
        Ok(match self.st.lock().unwrap().locks.get(path) {
            Some(pid) => Err(*pid),
            None => Ok(crate::HeldLock::simulated()),
        })
    }
    fn create_partial(&self, dest: &Path, mode: u32) -> io::Result<Box<dyn crate::PartialFile>> {
        Ok(Box::new(FakePartial {
            st: Arc::clone(&self.st),
            dest: dest.to_path_buf(),
            mode,
            now: self.now,
            data: Vec::new(),
        }))
    }
    fn create_dir_exclusive(&self, path: &Path, mode: u32) -> io::Result<()> {
        if self.exists(path) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, path.display().to_string()));
        }
        if !path.parent().is_some_and(|p| self.is_dir(p)) {
            return Err(io::Error::new(io::ErrorKind::NotFound, path.display().to_string()));
        }
        let mut st = self.st.lock().unwrap();
        st.wrote(path, mode, self.now);
        st.dirs.push(path.to_path_buf());
        st.stats.insert(path.to_path_buf(), FileStat { kind: FileKind::Dir, uid: self.euid, mode });
        Ok(())
    }
    fn lstat(&self, path: &Path) -> io::Result<FileStat> {
        let st = self.st.lock().unwrap();
        st.stat(path).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }
    fn unix_http_get(&self, socket: &Path, path: &str) -> io::Result<UnixHttpResponse> {
        let raw = self.st.lock().unwrap().unix_http.get(&(socket.to_path_buf(), path.to_string())).cloned();
        match raw {
            Some(r) => UnixHttpResponse::parse(&r),
            None => Err(io::Error::new(io::ErrorKind::ConnectionRefused, socket.display().to_string())),
        }
    }
}

/// A partial file in memory: lands in the fake filesystem only on commit.
struct FakePartial {
    st: Arc<Mutex<State>>,
    dest: PathBuf,
    mode: u32,
    now: SystemTime,
    data: Vec<u8>,
}

impl crate::PartialFile for FakePartial {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.data.extend_from_slice(buf);
        Ok(())
    }
    fn commit(self: Box<Self>) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        st.wrote(&self.dest, self.mode, self.now);
        st.files.insert(self.dest.clone(), self.data);
        Ok(())
    }
}
