//! A user-space delay line for `cargo xtask bench tunnel --delay-ms N [--rate-mbit M]`
//! (issue 45): a TCP forwarder that holds every chunk it reads for half the round trip in each
//! direction before writing it on, optionally at a bounded rate, with bounded buffering.
//!
//! The bench puts one between the agent and the platform (the agent's `server` is the delay
//! line, so its tunnel crosses it) and one in front of the container for the reference (plain TCP
//! to the same container), so both paths see the same added round trip and the same link.
//!
//! **Bounded.** Each direction of a connection holds at most [`QUEUE_CHUNKS`] chunks of at most
//! [`CHUNK`] bytes (8 MiB): when they are all waiting, the reader stops reading and TCP pushes
//! back on the sender, as a router's full queue would (without dropping). A chunk stays queued for
//! the one-way delay, so that caps a connection's direction at about 8 MiB per one-way delay (840
//! MB/s at 10 ms one way, a 20 ms round trip; 335 MB/s at 25 ms), fewer when reads return
//! smaller chunks, for the tunnel and the reference alike. The cap is per connection: 4 direct
//! streams are 4 connections through the line, the tunnel's 4 streams share the agent's one. With `--rate-mbit`, a direction leaves at most that many bits per second
//! (a serialised link: a chunk leaves when the one before it has), on each connection.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;

/// The largest chunk a direction reads (and later writes) at once.
pub const CHUNK: usize = 64 * 1024;
/// Chunks a direction holds at most: 8 MiB in flight.
pub const QUEUE_CHUNKS: usize = 128;

/// The path's shape: its added round trip and optional rate per direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// The added round trip: each direction waits half of it.
    pub round_trip: Duration,
    /// Bits per second a direction carries at most; `None`: as fast as the machine goes.
    pub rate_bits: Option<f64>,
}

impl Path {
    pub fn one_way(&self) -> Duration {
        self.round_trip / 2
    }
}

/// When a chunk of `len` bytes read at `read_at` leaves, given when the link is next free
/// (`free_at`, the end of the chunk before it): not before its delay, and not before the link
/// has carried the chunk before it at the path's rate. Returns (when it leaves, when the link is
/// free again).
pub fn departure(path: &Path, read_at: Instant, len: usize, free_at: Instant) -> (Instant, Instant) {
    let due = read_at + path.one_way();
    match path.rate_bits {
        None => (due, due),
        Some(bits) => {
            let start = due.max(free_at);
            (start, start + Duration::from_secs_f64(len as f64 * 8.0 / bits))
        }
    }
}

/// A running delay line: listening on [`DelayLine::port`], forwarding to the target. Dropping it
/// stops accepting (open connections run on until either end closes).
pub struct DelayLine {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl DelayLine {
    /// Listens on a free loopback port and forwards each connection to `target` over `path`.
    pub fn start(target: impl ToSocketAddrs, path: Path) -> Result<DelayLine> {
        let target = target.to_socket_addrs()?.next().ok_or_else(|| anyhow::anyhow!("no target address"))?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(target) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                direction(client, server, path);
                direction(s2, c2, path);
            }
        });
        Ok(DelayLine { port, stop })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A chunk and when it was read; `None`: the end.
type Stamped = Option<(Instant, Vec<u8>)>;

/// One direction, `from` to `to`: a reader thread that stamps chunks, a writer thread that
/// sends each when [`departure`] says. `None` in the queue: `from` ended (the writer then shuts
/// `to`'s writing side down, after the chunks before it).
fn direction(mut from: TcpStream, mut to: TcpStream, path: Path) {
    let (tx, rx): (SyncSender<Stamped>, Receiver<Stamped>) = sync_channel(QUEUE_CHUNKS);
    thread::spawn(move || {
        loop {
            let mut buf = vec![0u8; CHUNK];
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send(Some((Instant::now(), buf))).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(None);
    });
    thread::spawn(move || {
        let mut free_at = Instant::now();
        while let Ok(Some((read_at, chunk))) = rx.recv() {
            let (leave, free) = departure(&path, read_at, chunk.len(), free_at);
            free_at = free;
            let now = Instant::now();
            if leave > now {
                thread::sleep(leave - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        // Draining `rx` is not needed: dropping it makes the reader's next send fail.
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_leaves_after_half_the_round_trip_and_after_the_one_before_it_at_the_rate() {
        let t = Instant::now();
        let fast = Path { round_trip: Duration::from_millis(20), rate_bits: None };
        assert_eq!(departure(&fast, t, 1000, t + Duration::from_secs(5)).0, t + Duration::from_millis(10));
        // 100 Mbit/s: 125,000 bytes take 10 ms on the link.
        let slow = Path { round_trip: Duration::from_millis(20), rate_bits: Some(100e6) };
        let (leave, free) = departure(&slow, t, 125_000, t);
        assert_eq!(leave, t + Duration::from_millis(10));
        assert_eq!(free, t + Duration::from_millis(20));
        // The next chunk, read at once, waits for the link.
        let (leave2, _) = departure(&slow, t, 125_000, free);
        assert_eq!(leave2, t + Duration::from_millis(20));
    }

    #[test]
    fn the_delay_line_carries_every_byte_in_order_and_the_end() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let echo = thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
        });
        let line =
            DelayLine::start(addr, Path { round_trip: Duration::from_millis(10), rate_bits: None }).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", line.port())).unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let t = Instant::now();
        c.write_all(&data).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        echo.join().unwrap();
        assert!(back == data, "the bytes come back whole and in order");
        assert!(t.elapsed() >= Duration::from_millis(10), "one round trip at least");
    }
}
