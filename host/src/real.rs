//! The real machine.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use crate::{Cmd, FsSpace, Host, Output};

/// The machine gpum runs on, with every path mapped under `root` (`/` in production; a
/// scratch directory in tests that exercise writes, such as uninstall).
#[derive(Debug, Clone)]
pub struct RealHost {
    root: PathBuf,
}

impl Default for RealHost {
    fn default() -> Self {
        Self { root: PathBuf::from("/") }
    }
}

impl RealHost {
    pub fn new() -> Self {
        Self::default()
    }
    /// A machine whose filesystem is rooted at `root`. Processes still run on the real machine.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
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
    fn unmap(&self, p: &Path) -> PathBuf {
        match p.strip_prefix(&self.root) {
            Ok(rel) => Path::new("/").join(rel),
            Err(_) => p.to_path_buf(),
        }
    }
}

impl Host for RealHost {
    fn run(&self, cmd: &Cmd) -> io::Result<Output> {
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if cmd.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = c.spawn()?;
        if let Some(data) = &cmd.stdin {
            let mut sin = child.stdin.take().expect("piped stdin");
            // A child that exits without reading stdin gives EPIPE; its exit code tells more.
            let _ = sin.write_all(data);
        }
        let out = child.wait_with_output()?;
        Ok(Output { code: out.status.code(), stdout: out.stdout, stderr: out.stderr })
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut f = fs::File::open(self.map(path))?;
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    fn exists(&self, path: &Path) -> bool {
        self.map(path).exists()
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.map(path).is_dir()
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

    fn space(&self, path: &Path) -> io::Result<FsSpace> {
        let st = nix::sys::statvfs::statvfs(&self.map(path)).map_err(io::Error::from)?;
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

    fn arch(&self) -> String {
        nix::sys::utsname::uname()
            .map(|u| u.machine().to_string_lossy().into_owned())
            .unwrap_or_else(|_| std::env::consts::ARCH.to_string())
    }

    fn stdin_is_tty(&self) -> bool {
        use std::io::IsTerminal;
        io::stdin().is_terminal()
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
