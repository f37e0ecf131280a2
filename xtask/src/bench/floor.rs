//! The floor under the agent's CPU per heartbeat on this machine, measured in the same run.
//!
//! A timed figure on a shared virtual machine moves by 2x from one machine (or hour) to the
//! next: a wake-up after a second asleep meets cold caches, and what that costs is the host's.
//! So `cargo xtask bench agent` also times the least a heartbeat can be here: a thread of the
//! bench that, once a second, makes the system calls no heartbeat can do without, and nothing
//! else. It sleeps to the next beat; reads the CPU counters (the root cgroup's `cpu.stat` and the
//! CPUs online where the agent reads them, else `/proc/stat`; see [`cpu_files`]) and
//! `/proc/meminfo` through handles kept open, each whole (`pread` from 0, one read when it leaves
//! room), and the hostname with `uname(2)`, as the agent does; asks the free space of Docker's
//! data root; writes a steady heartbeat (the protocol's own JSON for it, made once) as one
//! HTTP/1.1 request on a kept loopback connection to the same platform (the agent's goes to the
//! bench's byte-counting relay, also on loopback), as a node of its own with its real token;
//! and reads the answer, which must be `200`. No parsing, no JSON beyond the sequence number, no
//! runtime. Its CPU time (its own thread's `schedstat`) per beat is the
//! machine's share of every heartbeat, and the agent's figure divided by it is the agent's own
//! share: the ratio is what compares between machines.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What the floor measured.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Milliseconds of CPU per beat.
    pub cpu_ms: f64,
    pub beats: u64,
}

/// Starts the floor's thread: `beats` heartbeats, one per second, the first after `delay`,
/// to the platform on `127.0.0.1:port` as the node whose `config.toml` is in `state`.
pub fn start(
    port: u16,
    state: &Path,
    delay: Duration,
    beats: u64,
) -> Result<std::thread::JoinHandle<Result<Floor>>> {
    let token = super::cost::config_value(state, "token")?;
    Ok(std::thread::spawn(move || run(port, &token, delay, beats)))
}

fn run(port: u16, token: &str, delay: Duration, beats: u64) -> Result<Floor> {
    let mut paths = cpu_files();
    paths.push("/proc/meminfo".into());
    let files: Vec<std::fs::File> = paths
        .iter()
        .map(|p| std::fs::File::open(p).with_context(|| format!("open {p}")))
        .collect::<Result<_>>()?;
    let body = body_template()?;
    let mut conn = connect(port)?;
    let mut buf = vec![0u8; 8192];
    let mut answer = Vec::with_capacity(1024);
    let start = Instant::now() + delay;
    let mut cpu0 = 0;
    // One beat before the window, so that the connection and the buffers are warm.
    for i in 0..=beats {
        let at = start + Duration::from_secs(i);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        if i == 1 {
            cpu0 = thread_cpu_ns()?;
        }
        for f in &files {
            read_whole(f, &mut buf)?;
        }
        nix::sys::utsname::uname().context("uname")?;
        nix::sys::statvfs::statvfs("/var/lib/docker")
            .or_else(|_| nix::sys::statvfs::statvfs("/"))
            .context("statvfs")?;
        let req = request(port, token, &body, i + 1);
        if beat(&mut conn, &req, &mut answer)? == Beat::Closed {
            // The platform closed the kept connection before answering: once more on a new
            // one, as the agent would. Any other failure ends the floor.
            conn = connect(port)?;
            if beat(&mut conn, &req, &mut answer)? == Beat::Closed {
                bail!("the platform closed a new connection without answering the floor");
            }
        }
    }
    let cpu1 = thread_cpu_ns()?;
    Ok(Floor { cpu_ms: (cpu1 - cpu0) as f64 / 1e6 / beats as f64, beats })
}

/// The files the agent reads its CPU load from on this machine, chosen by the agent's own rule
/// ([`gpum_agent::cpu::root_cgroup_cpu_stat`]): the root cgroup's `cpu.stat` and the list of
/// CPUs online, else `/proc/stat`.
fn cpu_files() -> Vec<String> {
    let host = gpum_host::RealHost::new();
    match gpum_agent::cpu::root_cgroup_cpu_stat(&host) {
        Some(stat) => vec![stat.display().to_string(), gpum_agent::cpu::CPUS_ONLINE.to_string()],
        None => vec!["/proc/stat".to_string()],
    }
}

fn connect(port: u16) -> Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).context("the floor connects to the platform")?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// The file whole, from offset 0: `pread` until a read leaves room in the buffer or returns 0,
/// as the agent's `read_kept` does.
fn read_whole(f: &std::fs::File, buf: &mut Vec<u8>) -> Result<usize> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(n * 2, 0);
        }
        let got = f.read_at(&mut buf[n..], n as u64)?;
        if got == 0 || n + got < buf.len() {
            return Ok(n + got);
        }
        n += got;
    }
}

/// The JSON of a steady heartbeat, as the protocol's types write it, with `seq` 0 (about 280
/// bytes): the sequence number is spliced in per beat.
fn body_template() -> Result<String> {
    use gpum_protocol::{Health, HeartbeatRequest, Metrics};
    let req = HeartbeatRequest {
        seq: 0,
        inventory_hash: "0".repeat(64),
        metrics: Metrics {
            cpu_load_pct: 1.5,
            ram_used_mib: 1024,
            ram_total_mib: 24_104,
            disk_free_gib: 77,
            gpus: Vec::new(),
        },
        health: Health { docker_ok: true, ..Default::default() },
        ..Default::default()
    };
    let s = serde_json::to_string(&req)?;
    if !s.starts_with(SEQ0) {
        bail!("a heartbeat's JSON no longer starts with {SEQ0}");
    }
    Ok(s)
}

const SEQ0: &str = r#"{"seq":0,"#;

/// One heartbeat request: the head, then the body with its sequence number.
fn request(port: u16, token: &str, body: &str, seq: u64) -> Vec<u8> {
    let rest = &body[SEQ0.len()..];
    let body = format!(r#"{{"seq":{seq},{rest}"#);
    let mut r = format!(
        "POST /api/v1/agent/heartbeat HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nuser-agent: gpum-floor\r\n\
         content-type: application/json\r\nauthorization: Bearer {token}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body.as_bytes());
    r
}

#[derive(Debug, PartialEq, Eq)]
enum Beat {
    /// A `200` answer, read whole.
    Answered,
    /// The connection was closed before a byte of the answer came.
    Closed,
}

/// Writes the request and reads the whole answer (head, then `content-length` bytes); an answer
/// other than `200`, or one cut short, is an error.
fn beat(conn: &mut TcpStream, req: &[u8], answer: &mut Vec<u8>) -> Result<Beat> {
    answer.clear();
    if let Err(e) = conn.write_all(req) {
        return match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => Ok(Beat::Closed),
            _ => Err(e.into()),
        };
    }
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&answer[..end]).context("the answer's head")?;
            if !head.starts_with("HTTP/1.1 200") {
                bail!("the platform answered the floor's heartbeat with {:?}", head.lines().next());
            }
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
                })
                .context("content-length in the answer")?;
            if answer.len() >= end + 4 + len {
                return Ok(Beat::Answered);
            }
        }
        let n = match conn.read(&mut chunk) {
            Err(e) if answer.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => 0,
            r => r?,
        };
        if n == 0 {
            if answer.is_empty() {
                return Ok(Beat::Closed);
            }
            bail!("the platform closed the connection mid-answer");
        }
        answer.extend_from_slice(&chunk[..n]);
    }
}

/// This thread's CPU time so far, in nanoseconds (`/proc/thread-self/schedstat`, the clock
/// `bench agent` reads for the agent).
fn thread_cpu_ns() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    s.split_whitespace().next().and_then(|x| x.parse().ok()).context("schedstat")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request is a whole HTTP/1.1 POST whose body is a heartbeat the platform's types
    /// read back, with the sequence number given and the length it says.
    #[test]
    fn the_floors_request_is_a_heartbeat_with_its_sequence_number() {
        let body = body_template().unwrap();
        let req = request(8080, "tok", &body, 12_345);
        let text = String::from_utf8(req).unwrap();
        let (head, json) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /api/v1/agent/heartbeat HTTP/1.1\r\n"));
        assert!(head.contains("\r\nauthorization: Bearer tok\r\n"));
        assert!(head.contains(&format!("\r\ncontent-length: {}", json.len())));
        let hb: gpum_protocol::HeartbeatRequest = serde_json::from_str(json).unwrap();
        assert_eq!(hb.seq, 12_345);
        assert_eq!(hb.inventory_hash.len(), 64);
        assert!(hb.inventory.is_none() && hb.health.docker_ok);
    }

    /// A `200` answer is read whole, even in pieces; a connection closed before the answer says
    /// so (the floor then tries a new one); any other status, or an answer cut short, is an error.
    #[test]
    fn a_beat_wants_a_whole_200_answer() {
        use std::net::TcpListener;
        let serve = |answers: Vec<&'static [u8]>| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut req = [0u8; 4096];
                let _ = s.read(&mut req).unwrap();
                for a in answers {
                    s.write_all(a).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            connect(port).unwrap()
        };
        let mut answer = Vec::new();
        let ok: Vec<&[u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}", b"  "];
        assert_eq!(beat(&mut serve(ok), b"POST / HTTP/1.1\r\n\r\n", &mut answer).unwrap(), Beat::Answered);
        assert!(answer.ends_with(b"{}  "));
        assert_eq!(beat(&mut serve(vec![]), b"x", &mut answer).unwrap(), Beat::Closed);
        let refused: Vec<&[u8]> = vec![b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n"];
        let e = beat(&mut serve(refused), b"x", &mut answer).unwrap_err();
        assert!(e.to_string().contains("401"), "{e}");
        let cut: Vec<&[u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}"];
        let e = beat(&mut serve(cut), b"x", &mut answer).unwrap_err();
        assert!(e.to_string().contains("mid-answer"), "{e}");
    }

    /// A file is read whole, past the first buffer, and from its start each time.
    #[test]
    fn a_kept_file_is_read_whole_each_time() {
        let dir = std::env::temp_dir().join(format!("gpum-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, vec![b'x'; 20_000]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let mut buf = vec![0u8; 8192];
        assert_eq!(read_whole(&f, &mut buf).unwrap(), 20_000);
        assert_eq!(read_whole(&f, &mut buf).unwrap(), 20_000);
        assert!(read_whole(&std::fs::File::open("/proc/stat").unwrap(), &mut buf).unwrap() > 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
