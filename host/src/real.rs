//! The real machine.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use crate::{Cmd, FileKind, FileStat, FsSpace, Host, Output, UnixHttpResponse};

/// The machine gpum runs on, with every path mapped under `root` (`/` in production; a
/// scratch directory in tests that exercise writes, such as uninstall).
#[derive(Debug, Clone)]
pub struct RealHost {
    root: PathBuf,
    /// The files [`Host::read_kept`] keeps open (a few), by target path, each with the buffer
    /// it is read into (zeroed once, not at every read).
    kept: Arc<Mutex<Vec<Kept>>>,
}

#[derive(Debug)]
struct Kept {
    path: PathBuf,
    file: fs::File,
    buf: Vec<u8>,
}

impl Default for RealHost {
    fn default() -> Self {
        Self::with_root("/")
    }
}

impl RealHost {
    pub fn new() -> Self {
        Self::default()
    }
    /// A machine whose filesystem is rooted at `root`. Processes still run on the real machine.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), kept: Arc::default() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// Maps a target path under the root. `..` components are refused by dropping them, so a
    /// path can never escape the root.
    pub fn map(&self, path: &Path) -> PathBuf {
        let mut out = self.root.clone();
        for c in path.components() {
            if let Component::Normal(p) = c {
                out.push(p);
            }
        }
        out
    }
    /// [`RealHost::map`], without a copy where mapping changes nothing: the root is `/` and
    /// `path` is absolute with only plain components (no `.`, `..`, empty one or trailing `/`),
    /// which is every path the agent reads each heartbeat.
    fn at<'a>(&self, path: &'a Path) -> std::borrow::Cow<'a, Path> {
        use std::os::unix::ffi::OsStrExt;
        let b = path.as_os_str().as_bytes();
        let plain = b.len() > 1
            && b[0] == b'/'
            && b[1..].split(|c| *c == b'/').all(|seg| !seg.is_empty() && seg != b"." && seg != b"..");
        if plain && self.root.as_os_str() == "/" {
            std::borrow::Cow::Borrowed(path)
        } else {
            std::borrow::Cow::Owned(self.map(path))
        }
    }
    fn unmap(&self, p: &Path) -> PathBuf {
        match p.strip_prefix(&self.root) {
            Ok(rel) => Path::new("/").join(rel),
            Err(_) => p.to_path_buf(),
        }
    }
}

/// Reads the whole of `f` into `buf` (grown as needed), from offset 0 with `pread`, and returns
/// its length: a `/proc` file is made anew when read from the start. A read that leaves room in
/// the buffer is the end: a `/proc` file made whole at once (`/proc/stat`, `/proc/meminfo`)
/// hands over all of it that fits, as a regular file does, so the read that would return 0 is
/// skipped. A full buffer grows and the file is read on.
fn read_all_at(f: &fs::File, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => return Ok(n),
            Ok(k) if n + k < buf.len() => return Ok(n + k),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl Host for RealHost {
    fn run(&self, cmd: &Cmd) -> io::Result<Output> {
        let mut child = command(cmd, &cmd.args).spawn()?;
        if let Some(data) = &cmd.stdin {
            let mut sin = child.stdin.take().expect("piped stdin");
            // A child that exits without reading stdin gives EPIPE; its exit code tells more.
            let _ = sin.write_all(data);
        }
        let out = child.wait_with_output()?;
        Ok(Output { code: out.status.code(), stdout: out.stdout, stderr: out.stderr })
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut f = fs::File::open(self.at(path))?;
        // Room up front: files under /proc say they are empty, and into an empty Vec std probes
        // with a 32-byte read and then doubles (9 reads for /proc/meminfo, which the agent reads
        // every heartbeat; 2 like this).
        let mut v = Vec::with_capacity(8192);
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        crate::utf8(self.read(path)?)
    }

    fn read_pieces(&self, path: &Path, each: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        let mut f = fs::File::open(self.at(path))?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match f.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => each(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn read_kept(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let i = match kept.iter().position(|k| k.path.as_os_str() == path.as_os_str()) {
            Some(i) => i,
            None => {
                let file = fs::File::open(self.map(path))?;
                kept.push(Kept { path: path.to_path_buf(), file, buf: vec![0u8; 8192] });
                kept.len() - 1
            }
        };
        let k = &mut kept[i];
        let res = read_all_at(&k.file, &mut k.buf).map(|n| k.buf[..n].to_vec());
        if res.is_err() {
            // Opened again at the next read.
            kept.swap_remove(i);
        }
        res
    }

    fn hostname(&self) -> io::Result<String> {
        if self.root != Path::new("/") {
            // A scratch root stands in for the machine: its file, not the kernel's answer.
            return crate::hostname_file(self);
        }
        let u = nix::sys::utsname::uname()?;
        Ok(u.nodename().to_string_lossy().trim().to_string())
    }

    fn exists(&self, path: &Path) -> bool {
        self.at(path).exists()
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.at(path).is_dir()
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut v: Vec<PathBuf> =
            fs::read_dir(self.map(path))?.filter_map(|e| e.ok()).map(|e| self.unmap(&e.path())).collect();
        v.sort();
        Ok(v)
    }

    fn write_atomic(&self, path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
        write_atomic(&self.map(path), data, mode)
    }

    fn create_dir_all(&self, path: &Path, mode: u32) -> io::Result<()> {
        let p = self.map(path);
        fs::create_dir_all(&p)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(self.map(path))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(self.map(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let to = self.map(to);
        fs::rename(self.map(from), &to)?;
        if let Some(d) = to.parent().and_then(|d| fs::File::open(d).ok()) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn space(&self, path: &Path) -> io::Result<FsSpace> {
        let st = nix::sys::statvfs::statvfs(&*self.at(path)).map_err(io::Error::from)?;
        let frag = st.fragment_size() as u64;
        Ok(FsSpace {
            avail_bytes: st.blocks_available() as u64 * frag,
            total_bytes: st.blocks() as u64 * frag,
        })
    }

    fn env(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }

    fn euid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn monotonic(&self) -> std::time::Duration {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(std::time::Duration::from)
            .unwrap_or_default()
    }

    fn sleep(&self, d: std::time::Duration) {
        std::thread::sleep(d)
    }

    fn arch(&self) -> String {
        nix::sys::utsname::uname()
            .map(|u| u.machine().to_string_lossy().into_owned())
            .unwrap_or_else(|_| std::env::consts::ARCH.to_string())
    }

    fn stdin_is_tty(&self) -> bool {
        use std::io::IsTerminal;
        io::stdin().is_terminal()
    }

    fn stderr_is_tty(&self) -> bool {
        use std::io::IsTerminal;
        io::stderr().is_terminal()
    }

    fn run_with_status(&self, cmd: &Cmd, on_line: &mut dyn FnMut(&str)) -> io::Result<Output> {
        use std::io::BufRead;
        use std::os::fd::AsRawFd;
        // Both ends are made close-on-exec; the writing end is then left open across exec, so
        // the child has it under the number its arguments name (the installer starts no other
        // process meanwhile), and the parent's copy is closed once the child is started.
        let (reader, writer) = io::pipe()?;
        nix::fcntl::fcntl(writer.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
            .map_err(io::Error::from)?;
        let fd = writer.as_raw_fd().to_string();
        let args: Vec<String> = cmd.args.iter().map(|a| a.replace(crate::STATUS_FD, &fd)).collect();
        let spawned = command(cmd, &args).spawn();
        drop(writer);
        let mut child = spawned?;
        if let Some(data) = &cmd.stdin {
            let mut sin = child.stdin.take().expect("piped stdin");
            let _ = sin.write_all(data);
        }
        // The status lines come through a channel, so that a descendant that kept the pipe
        // open (a daemon a package started) cannot hold the caller once the child has ended.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut r = io::BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        if tx.send(text.trim_end_matches(['\n', '\r']).to_string()).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        let (mut so, mut se) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
        std::thread::scope(|s| {
            let out = s.spawn(move || {
                let mut v = Vec::new();
                so.read_to_end(&mut v).map(|_| v)
            });
            let err = s.spawn(move || {
                let mut v = Vec::new();
                se.read_to_end(&mut v).map(|_| v)
            });
            let tick = std::time::Duration::from_millis(100);
            let status = loop {
                match rx.recv_timeout(tick) {
                    Ok(l) => on_line(&l),
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break child.wait()?,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        if let Some(st) = child.try_wait()? {
                            break st;
                        }
                    }
                }
            };
            // What the child wrote before it ended, still in the pipe: the reader ends at the
            // pipe's end, or gives up after a second when a descendant holds it open.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
                match rx.recv_timeout(left) {
                    Ok(l) => on_line(&l),
                    Err(_) => break,
                }
            }
            let join = |h: std::thread::ScopedJoinHandle<'_, io::Result<Vec<u8>>>| {
                h.join().unwrap_or_else(|_| Err(io::Error::other("reader thread panicked")))
            };
            Ok(Output { code: status.code(), stdout: join(out)?, stderr: join(err)? })
        })
    }

    fn changed(&self, path: &Path) -> io::Result<SystemTime> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(self.map(path))?;
        let secs = u64::try_from(m.ctime()).unwrap_or(0);
        Ok(SystemTime::UNIX_EPOCH
            + std::time::Duration::new(secs, m.ctime_nsec().clamp(0, 999_999_999) as u32))
    }

    fn confirm(&self, prompt: &str) -> io::Result<Option<bool>> {
        // No controlling terminal (cron, cloud-init, CI): ENXIO or ENOENT. Nobody to ask.
        let Ok(read) = OpenOptions::new().read(true).write(true).open("/dev/tty") else { return Ok(None) };
        let write = read.try_clone()?;
        let term = dialoguer::console::Term::read_write_pair(read, write);
        dialoguer::Confirm::new()
            .with_prompt(prompt)
            .default(false)
            .interact_on_opt(&term)
            .map_err(|dialoguer::Error::IO(e)| e)
    }

    fn lock_holder(&self, path: &Path) -> io::Result<Option<i32>> {
        use std::os::fd::AsRawFd;
        // No lock file means nobody has ever locked it, so nobody holds it.
        let f = match fs::File::open(self.map(path)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // F_GETLK asks "would this write lock conflict, and with whom?" without taking it; it
        // needs no write access to the file.
        let mut fl = whole_file_write_lock();
        nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut fl)).map_err(io::Error::from)?;
        Ok(if fl.l_type == libc::F_UNLCK as libc::c_short { None } else { Some(fl.l_pid) })
    }

    fn try_lock(&self, path: &Path) -> io::Result<Result<crate::HeldLock, i32>> {
        use std::os::fd::AsRawFd;
        // O_NOFOLLOW: a symlink planted at `path` is refused, never followed to create a file.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.map(path))?;
        let mut fl = whole_file_write_lock();
        match nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_SETLK(&fl)) {
            Ok(_) => Ok(Ok(crate::HeldLock::on(f))),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => {
                // Held: ask by whom (it may have gone in between: then the pid is unknown).
                nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut fl))
                    .map_err(io::Error::from)?;
                Ok(Err(if fl.l_type == libc::F_UNLCK as libc::c_short { 0 } else { fl.l_pid }))
            }
            Err(e) => Err(io::Error::from(e)),
        }
    }

    fn create_partial(&self, dest: &Path, mode: u32) -> io::Result<Box<dyn crate::PartialFile>> {
        let dest = self.map(dest);
        let dir = dest.parent().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent"))?;
        let name = dest.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no name"))?;
        let tmp = dir.join(format!(".{}.partial.{}", name.to_string_lossy(), std::process::id()));
        let file = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        Ok(Box::new(RealPartial { file: Some(file), tmp, dest }))
    }

    fn create_dir_exclusive(&self, path: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let p = self.map(path);
        // mkdir(2) fails with EEXIST on anything already there, a dangling symlink included.
        fs::DirBuilder::new().mode(mode).create(&p)?;
        // fchmod through a descriptor opened without following a symlink, so a swap between
        // the mkdir and here cannot redirect the chmod.
        let d = OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(&p)?;
        d.set_permissions(fs::Permissions::from_mode(mode))
    }

    fn lstat(&self, path: &Path) -> io::Result<FileStat> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(self.map(path))?;
        let t = m.file_type();
        let kind = if t.is_symlink() {
            FileKind::Symlink
        } else if t.is_dir() {
            FileKind::Dir
        } else if t.is_file() {
            FileKind::File
        } else {
            FileKind::Other
        };
        Ok(FileStat { kind, uid: m.uid(), mode: m.mode() & 0o7777 })
    }

    fn unix_http_get(&self, socket: &Path, path: &str) -> io::Result<UnixHttpResponse> {
        use std::os::unix::net::UnixStream;
        let timeout = Some(std::time::Duration::from_secs(3));
        let mut s = UnixStream::connect(self.map(socket))?;
        s.set_read_timeout(timeout)?;
        s.set_write_timeout(timeout)?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
        let mut resp = Vec::with_capacity(16 * 1024);
        s.read_to_end(&mut resp)?;
        UnixHttpResponse::parse(&resp)
    }
}

/// Atomic write with the mode set at creation: temp file (O_EXCL, `mode`), fsync, rename,
/// directory fsync. The mode is re-applied with fchmod so a restrictive umask cannot narrow it
/// (a 0644 keyring must be world-readable for apt's `_apt` user).
pub fn write_atomic(dest: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = dest.parent().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent"))?;
    let name = dest.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no name"))?;
    let mut n = 0u32;
    let (tmp, mut f) = loop {
        let tmp = dir.join(format!(".{}.tmp.{}.{}", name.to_string_lossy(), std::process::id(), n));
        match OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err(e),
        }
    };
    let res = (|| {
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, dest)?;
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// A partial file on the real machine: removed on drop unless committed.
struct RealPartial {
    file: Option<fs::File>,
    tmp: PathBuf,
    dest: PathBuf,
}

impl crate::PartialFile for RealPartial {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.as_mut().expect("open until commit").write_all(buf)
    }

    fn commit(mut self: Box<Self>) -> io::Result<()> {
        let f = self.file.take().expect("open until commit");
        f.sync_all()?;
        drop(f);
        fs::rename(&self.tmp, &self.dest)?;
        if let Some(d) = self.dest.parent().and_then(|d| fs::File::open(d).ok()) {
            let _ = d.sync_all();
        }
        // Committed: nothing for Drop to remove.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for RealPartial {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// `cmd`'s program with `args`, stdout and stderr piped, stdin piped when `cmd` has some.
fn command(cmd: &Cmd, args: &[String]) -> Command {
    let mut c = Command::new(&cmd.program);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(if cmd.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    c
}

/// A POSIX write lock over the whole file (`F_GETLK` asks about it, `F_SETLK` takes it).
fn whole_file_write_lock() -> libc::flock {
    libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status pipe: the child writes to the descriptor its arguments name, the caller gets
    /// each line as it comes, stdout and stderr are collected apart, and the exit code is kept.
    #[test]
    fn a_status_pipe_gives_its_lines_and_leaves_stdout_and_stderr_as_they_were() {
        let script = "echo 'dlstatus:1:50.0000:Retrieving file 1 of 2' >&$0; echo out; \
                      echo err >&2; printf 'pmstatus:jq:75.0000:Unpacking jq' >&$0; exit 3";
        // bash: dash takes a descriptor of one digit only, and the pipe's may have two.
        let cmd = Cmd::new("bash").args(["-c", script, crate::STATUS_FD]);
        let mut lines = Vec::new();
        let out = RealHost::new().run_with_status(&cmd, &mut |l| lines.push(l.to_string())).unwrap();
        let want = ["dlstatus:1:50.0000:Retrieving file 1 of 2", "pmstatus:jq:75.0000:Unpacking jq"];
        assert_eq!(lines, want, "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            (out.code, out.stdout_str().as_str(), out.stderr.as_slice()),
            (Some(3), "out\n", &b"err\n"[..])
        );
        // A program that cannot start is an error, as with `run`.
        let missing = Cmd::new("/nonexistent/program").arg(crate::STATUS_FD);
        assert!(RealHost::new().run_with_status(&missing, &mut |_| {}).is_err());
    }

    #[test]
    fn partial_file_lands_only_on_commit() {
        let dir = tempfile_dir();
        let host = RealHost::with_root(&dir);
        let entries = || fs::read_dir(&dir).unwrap().count();

        let mut p = host.create_partial(Path::new("/agent"), 0o755).unwrap();
        p.write_all(b"half").unwrap();
        assert_eq!(entries(), 1, "the bytes are on disk, under a temporary name");
        assert!(!dir.join("agent").exists(), "not under the final name before commit");
        drop(p);
        assert_eq!(entries(), 0, "dropping an uncommitted partial file deletes it");

        let mut p = host.create_partial(Path::new("/agent"), 0o755).unwrap();
        p.write_all(b"whole").unwrap();
        p.commit().unwrap();
        assert_eq!(fs::read(dir.join("agent")).unwrap(), b"whole");
        assert_eq!(fs::metadata(dir.join("agent")).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(entries(), 1, "nothing else is left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_needs_no_copy_only_where_mapping_changes_nothing() {
        let root = RealHost::new();
        let scratch = RealHost::with_root("/scratch");
        for p in [
            "/proc/meminfo",
            "/",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/a/b/",
            "/a/.",
            "/a/..",
            "relative/x",
            "",
            "/.x/..y/z.",
        ] {
            let p = Path::new(p);
            assert_eq!(root.at(p), root.map(p), "{p:?}");
            assert_eq!(scratch.at(p), scratch.map(p), "{p:?}");
        }
        assert!(matches!(root.at(Path::new("/proc/meminfo")), std::borrow::Cow::Borrowed(_)));
        assert!(matches!(root.at(Path::new("/a/../b")), std::borrow::Cow::Owned(_)));
    }

    #[test]
    fn a_kept_file_is_read_whole_and_anew_each_time() {
        let dir = tempfile_dir();
        let host = RealHost::with_root(&dir);
        // Longer than the first read's 8 KiB, and changed in place (same inode) between reads.
        let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(dir.join("figures"), &big).unwrap();
        assert_eq!(host.read_kept(Path::new("/figures")).unwrap(), big);
        fs::write(dir.join("figures"), b"short now").unwrap();
        assert_eq!(host.read_kept(Path::new("/figures")).unwrap(), b"short now");
        assert_eq!(host.kept.lock().unwrap().len(), 1, "one handle, kept");
        assert_eq!(host.read_kept(Path::new("/missing")).unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();

        // A /proc file is made again at each read from the start: the uptime moves on.
        let proc = RealHost::new();
        let first = proc.read_kept(Path::new("/proc/uptime")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let second = proc.read_kept(Path::new("/proc/uptime")).unwrap();
        assert_ne!(first, second, "the second read came from the kernel, not a cache");
        let uptime = |b: &[u8]| -> f64 {
            std::str::from_utf8(b).unwrap().split_whitespace().next().unwrap().parse().unwrap()
        };
        assert!(uptime(&second) > uptime(&first));
    }

    #[test]
    fn the_hostname_is_the_kernels_or_the_scratch_roots() {
        let kernel = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert!(!kernel.trim().is_empty());
        assert_eq!(RealHost::new().hostname().unwrap(), kernel.trim(), "uname(2) agrees with the file");

        let dir = tempfile_dir();
        fs::create_dir_all(dir.join("proc/sys/kernel")).unwrap();
        fs::write(dir.join("proc/sys/kernel/hostname"), "scratch-box\n").unwrap();
        assert_eq!(RealHost::with_root(&dir).hostname().unwrap(), "scratch-box");
        fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "gpum-host-test.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// Issue 14, item 12: an exclusive mkdir adopts nothing that was there, and lstat sees a
    /// symlink and another user's directory for what they are. Runs as root to plant them.
    #[test]
    fn exclusive_dir_adopts_nothing_and_lstat_does_not_follow() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile_dir();
        let host = RealHost::with_root(&dir);
        let euid = nix::unistd::geteuid().as_raw();

        host.create_dir_exclusive(Path::new("/mine"), 0o700).unwrap();
        let st = host.lstat(Path::new("/mine")).unwrap();
        assert_eq!(st, FileStat { kind: FileKind::Dir, uid: euid, mode: 0o700 });

        // Already there: a directory (of another user, when we can make one), a symlink to a
        // directory, a dangling symlink. Each is refused and left exactly as it was.
        fs::create_dir(dir.join("theirs")).unwrap();
        fs::set_permissions(dir.join("theirs"), fs::Permissions::from_mode(0o777)).unwrap();
        let other = if euid == 0 { 65534 } else { euid };
        if euid == 0 {
            std::os::unix::fs::chown(dir.join("theirs"), Some(other), Some(other)).unwrap();
        }
        std::os::unix::fs::symlink(dir.join("theirs"), dir.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
        for p in ["/theirs", "/link", "/dangling", "/mine"] {
            let e = host.create_dir_exclusive(Path::new(p), 0o700).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{p}");
        }
        let theirs = fs::symlink_metadata(dir.join("theirs")).unwrap();
        assert_eq!((theirs.uid(), theirs.mode() & 0o777), (other, 0o777), "left as it was");
        assert!(!dir.join("nowhere").exists(), "nothing created through the dangling link");
        assert_eq!(host.lstat(Path::new("/link")).unwrap().kind, FileKind::Symlink);
        assert_eq!(host.lstat(Path::new("/theirs")).unwrap().uid, other);
        assert_eq!(host.lstat(Path::new("/missing")).unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn http10_split() {
        let r = UnixHttpResponse::parse(
            b"HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nServer: Docker/27.4.1 (linux)\r\n\r\nOK",
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("api-version"), Some("1.41"));
        assert_eq!(r.header("Server"), Some("Docker/27.4.1 (linux)"));
        assert_eq!(r.body, b"OK");
        assert!(UnixHttpResponse::parse(b"garbage").is_err());
        assert!(UnixHttpResponse::parse(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn lock_probe_sees_another_process_s_fcntl_lock() {
        // dpkg and apt take POSIX fcntl locks; perl (Debian's perl-base) can take one too. The
        // pack layout is x86_64's struct flock.
        if Command::new("perl").arg("-v").output().is_err() {
            eprintln!("SKIP: no perl to hold a lock");
            return;
        }
        let dir = std::env::temp_dir().join(format!("gpum-host-lock-held-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock-frontend");
        write_atomic(&path, b"", 0o640).unwrap();
        let script = "use Fcntl; open(my $f, '+<', $ARGV[0]) or die; \
                      my $l = pack('s s x4 q q i x4', F_WRLCK, 0, 0, 0, 0); \
                      fcntl($f, F_SETLKW, $l) or die $!; \
                      $| = 1; print \"locked\\n\"; <STDIN>;";
        let mut child = Command::new("perl")
            .args(["-e", script, path.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = [0u8; 7];
        child.stdout.take().unwrap().read_exact(&mut line).unwrap();
        assert_eq!(&line, b"locked\n");
        let h = RealHost::with_root(&dir);
        let held = h.lock_holder(Path::new("/lock-frontend"));
        let taken = h.try_lock(Path::new("/lock-frontend")).unwrap().map(|_| ());
        drop(child.stdin.take()); // EOF: perl exits and the lock goes with it.
        child.wait().unwrap();
        assert_eq!(held.unwrap(), Some(child.id() as i32));
        assert_eq!(taken, Err(child.id() as i32), "try_lock names the holder and takes nothing");
        assert_eq!(h.lock_holder(Path::new("/lock-frontend")).unwrap(), None);
        let lock = h.try_lock(Path::new("/lock-frontend")).unwrap();
        assert!(lock.is_ok(), "free once the holder is gone");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn try_lock_creates_its_file_0600_and_refuses_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpum-host-try-lock-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let h = RealHost::with_root(&dir);
        let lock = h.try_lock(Path::new("/install.lock")).unwrap();
        assert!(lock.is_ok());
        assert_eq!(fs::metadata(dir.join("install.lock")).unwrap().permissions().mode() & 0o7777, 0o600);
        std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("planted")).unwrap();
        assert!(h.try_lock(Path::new("/planted")).is_err(), "O_NOFOLLOW");
        assert!(!dir.join("elsewhere").exists(), "nothing created through the link");
        drop(lock);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lock_probe_sees_no_lock_on_a_fresh_or_missing_file() {
        let dir = std::env::temp_dir().join(format!("gpum-host-lock-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let h = RealHost::with_root(&dir);
        assert_eq!(h.lock_holder(Path::new("/missing")).unwrap(), None);
        write_atomic(&dir.join("lock"), b"", 0o640).unwrap();
        assert_eq!(h.lock_holder(Path::new("/lock")).unwrap(), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
