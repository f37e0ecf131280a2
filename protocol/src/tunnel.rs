//! What both ends of the agent's tunnel (issue 34) must agree on, beyond the wire types of the
//! crate root ([`crate::TunnelOpen`], [`crate::TunnelReply`]): yamux's settings, the first line
//! of a stream, the keepalive, and the copy buffer both ends move a stream's bytes through.
//! Only with the `tunnel` feature (it needs tokio and yamux); the agent and the platform turn it
//! on.
//!
//! **Keepalive.** yamux sends nothing on an idle connection, so a TLS terminator or a NAT with
//! an idle timeout cuts a quiet tunnel, and a connection whose peer is gone (a cable pulled, a
//! NAT that dropped its state) is never noticed. So the relay opens a stream every
//! [`PING_EVERY`] whose first line is [`PING`]; the agent answers [`PONG`] and closes it. The
//! relay drops a tunnel whose agent does not answer within [`PING_TIMEOUT`] (and frees the
//! node's place for its next tunnel); the agent drops one on which no stream came from the
//! relay for [`SILENCE`] and dials again with backoff. Each ping moves bytes both ways, so a
//! terminator's read timeout of 60 s or more is never reached. An older agent answers the ping
//! line with a refusal ([`crate::TunnelReply`]), which the relay counts as an answer too.

use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::limits;

/// Streams on one tunnel connection. yamux counts a stream until both its ends have let go of
/// it, and one stream past this ends the whole connection (issue 43, item 4), so the relay
/// never asks for more than [`MAX_TENANT_STREAMS`].
pub const MAX_STREAMS: usize = 1024;

/// What the relay keeps free of [`MAX_STREAMS`]: the keepalive's one stream at a time, and
/// streams one end has closed and the other not yet.
pub const STREAM_RESERVE: usize = 64;

/// The tenants' streams one tunnel carries at most, all its rentals together: one more is
/// refused (503) and nothing else is touched.
pub const MAX_TENANT_STREAMS: usize = MAX_STREAMS - STREAM_RESERVE;

/// The largest yamux data frame either end sends. yamux's default is 16 KiB; 64 KiB frames
/// take a quarter of the frames (and of the wake-ups between a stream and its connection) for
/// a bulk transfer. A frame is never larger than what the stream was given to write, so an
/// interactive stream's frames stay small.
pub const SPLIT_SEND_SIZE: usize = 64 * 1024;

/// The write buffer under a yamux connection: a frame's 12-byte header and its body leave in
/// one write (one TLS record, one TCP segment train) instead of two. yamux flushes after each
/// frame, so the buffer never holds more than one frame.
pub const CONNECTION_WRITE_BUFFER: usize = SPLIT_SEND_SIZE + 1024;
/// The read buffer under a yamux connection: a frame's header and body, and often the next
/// frames, come in one read.
pub const CONNECTION_READ_BUFFER: usize = 64 * 1024;

/// The first line of a keepalive stream, from the relay.
pub const PING: &[u8] = b"ping";
/// The agent's answer to [`PING`].
pub const PONG: &[u8] = b"pong";
/// How often the relay pings a tunnel.
pub const PING_EVERY: Duration = Duration::from_secs(20);
/// How long the relay waits for the answer to a ping before it drops the tunnel.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the agent waits for a stream from the relay (a ping or a tenant's) before it drops
/// the tunnel and dials again: three pings.
pub const SILENCE: Duration = Duration::from_secs(60);

/// The receive window one stream of a bulk transfer should reach: the bandwidth-delay product
/// of the paths a tunnel is built for (1 Gbit/s over 50 ms is 6.25 MB; 8 MiB covers it with
/// room). yamux starts every stream at its 256 KiB ([`yamux::DEFAULT_CREDIT`]) and doubles a
/// stream's window each time the sender used half of it within two round trips, so a stream's
/// window grows only while the tenant's bytes really flow faster than the window allows, and
/// it never shrinks while the stream lives (it is given back when the stream ends).
///
/// A window pinned at 256 KiB caps a stream at 256 KiB a round trip: 12.8 MB/s over 20 ms,
/// 5 MB/s over 50 ms, whatever the link. That was the case before issue 45: the connection's
/// window was exactly [`MAX_STREAMS`] × 256 KiB, and yamux lets a stream grow only into what
/// the connection's window holds beyond that guaranteed minimum.
pub const STREAM_WINDOW_TARGET: usize = 8 * 1024 * 1024;

/// What the streams of one connection may grow by, all together, beyond their 256 KiB each:
/// twice [`STREAM_WINDOW_TARGET`], because yamux grows a window by doubling (the step that
/// reaches the target may overshoot it up to twice), or two streams at the target at once.
/// Streams that want more share it: four bulk streams get 4 MiB more each.
pub const STREAM_WINDOW_GROWTH: usize = 2 * STREAM_WINDOW_TARGET;

/// The receive window of one tunnel connection, all streams together: each of [`MAX_STREAMS`]
/// guaranteed yamux's 256 KiB, plus [`STREAM_WINDOW_GROWTH`]: 1024 × 256 KiB + 16 MiB = 272 MiB.
/// It bounds what the peer may send that this end has not yet read, so it is the most one
/// tunnel's streams can make this end hold: 272 MiB only if the peer fills every one of 1024
/// streams and nobody reads them (the relay admits at most [`MAX_TENANT_STREAMS`] tenants'
/// streams, and each of those is read as fast as its tenant reads it). A bulk stream the
/// tenant reads promptly holds far less than its window.
pub const CONNECTION_RECEIVE_WINDOW: usize =
    MAX_STREAMS * yamux::DEFAULT_CREDIT as usize + STREAM_WINDOW_GROWTH;

/// yamux's settings for both ends: at most [`MAX_STREAMS`] streams, each starting with yamux's
/// 256 KiB window, which yamux grows towards the bandwidth-delay product while a stream's data
/// flows, within [`CONNECTION_RECEIVE_WINDOW`]; frames of at most [`SPLIT_SEND_SIZE`].
pub fn yamux_config() -> yamux::Config {
    let mut c = yamux::Config::default();
    c.set_max_connection_receive_window(Some(CONNECTION_RECEIVE_WINDOW));
    c.set_max_num_streams(MAX_STREAMS);
    c.set_split_send_size(SPLIT_SEND_SIZE);
    c
}

/// The connection yamux runs over: `io` with [`CONNECTION_READ_BUFFER`] and
/// [`CONNECTION_WRITE_BUFFER`].
pub fn buffered<T: tokio::io::AsyncRead + tokio::io::AsyncWrite>(io: T) -> tokio::io::BufStream<T> {
    tokio::io::BufStream::with_capacity(CONNECTION_READ_BUFFER, CONNECTION_WRITE_BUFFER, io)
}

/// Reads one line of at most [`limits::MAX_TUNNEL_LINE`] bytes (with its newline) and returns
/// it without the newline; what follows the line stays in the reader. End of stream before the
/// newline, or a longer line, is an error.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "no line"));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if line.len() > limits::MAX_TUNNEL_LINE {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the line is too long"));
        }
        if done {
            line.pop();
            return Ok(line);
        }
    }
}

/// The smallest and largest [`CopyBuffer`].
pub const COPY_BUFFER_MIN: usize = 4 * 1024;
pub const COPY_BUFFER_MAX: usize = 256 * 1024;

/// One direction's buffer of a stream that grows while data flows and shrinks when it does
/// not: it doubles (up to [`COPY_BUFFER_MAX`]) each time a read fills it, and goes back to
/// [`COPY_BUFFER_MIN`] after a read of less than a quarter of it. So a bulk transfer moves
/// large chunks (fewer frames, wake-ups and flushes per byte), while an idle or interactive
/// stream holds a few KiB.
pub struct CopyBuffer {
    buf: Vec<u8>,
}

impl Default for CopyBuffer {
    fn default() -> Self {
        CopyBuffer { buf: vec![0; COPY_BUFFER_MIN] }
    }
}

impl CopyBuffer {
    /// Where the next read goes.
    pub fn space(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The first `n` bytes, which a read just filled.
    pub fn data(&self, n: usize) -> &[u8] {
        &self.buf[..n]
    }

    /// The buffer's size now.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// After the bytes of a read of `n` are written out: grow or shrink for the next read.
    pub fn adapt(&mut self, n: usize) {
        let len = self.buf.len();
        if n == len && len < COPY_BUFFER_MAX {
            self.buf = vec![0; (len * 2).min(COPY_BUFFER_MAX)];
        } else if n < len / 4 && len > COPY_BUFFER_MIN {
            self.buf = vec![0; COPY_BUFFER_MIN];
        }
    }
}

/// Copies `r` to `w` through a [`CopyBuffer`] until `r` ends (then shuts `w` down) or either
/// fails; `each` is told the size of every chunk before it is written (the relay's byte budget
/// and idle clock). Each chunk is flushed, so an interactive stream's bytes never wait.
pub async fn pump<R, W, F, Fut>(mut r: R, mut w: W, mut each: F)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = CopyBuffer::default();
    loop {
        let n = match r.read(buf.space()).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        each(n).await;
        if w.write_all(buf.data(n)).await.is_err() || w.flush().await.is_err() {
            break;
        }
        buf.adapt(n);
    }
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn tunnel_lines_are_bounded_and_leave_what_follows() {
        let data = b"{\"rental\":\"x\",\"port\":1}\nSSH-2.0-rest".to_vec();
        let mut r = BufReader::new(&data[..]);
        assert_eq!(read_line(&mut r).await.unwrap(), b"{\"rental\":\"x\",\"port\":1}");
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut rest).await.unwrap();
        assert_eq!(rest, b"SSH-2.0-rest");
        // A line of exactly the limit (newline included) passes; one byte more does not.
        let mut max = vec![b'a'; limits::MAX_TUNNEL_LINE - 1];
        max.push(b'\n');
        assert_eq!(read_line(&mut BufReader::with_capacity(7, &max[..])).await.unwrap().len(), max.len() - 1);
        let long = vec![b'a'; limits::MAX_TUNNEL_LINE + 10];
        assert!(read_line(&mut BufReader::new(&long[..])).await.is_err());
        assert!(read_line(&mut BufReader::new(&b"no newline"[..])).await.is_err());
    }

    #[test]
    fn tunnel_copy_buffers_grow_while_data_flows_and_shrink_when_it_does_not() {
        let mut b = CopyBuffer::default();
        assert_eq!(b.capacity(), COPY_BUFFER_MIN);
        b.adapt(100);
        assert_eq!(b.capacity(), COPY_BUFFER_MIN, "an interactive stream stays small");
        let mut seen = vec![];
        for _ in 0..10 {
            let full = b.capacity();
            b.adapt(full);
            seen.push(b.capacity());
        }
        assert_eq!(seen[..6], [8192, 16384, 32768, 65536, 131072, 262144]);
        assert_eq!(b.capacity(), COPY_BUFFER_MAX, "never past the largest");
        b.adapt(COPY_BUFFER_MAX / 2);
        assert_eq!(b.capacity(), COPY_BUFFER_MAX, "half full: a transfer still flowing");
        b.adapt(10);
        assert_eq!(b.capacity(), COPY_BUFFER_MIN, "the flow stopped: back to small");
    }

    #[test]
    fn tunnel_window_has_room_to_grow_past_the_bandwidth_delay_product() {
        // yamux lets a stream's window grow only into what the connection's window holds beyond
        // 256 KiB for every stream allowed (its `connection_limit` in flow_control.rs).
        let credit = yamux::DEFAULT_CREDIT as usize;
        let room = CONNECTION_RECEIVE_WINDOW - MAX_STREAMS * credit;
        // One bulk stream can double from 256 KiB past the target (its last step may take up
        // to twice the target): 1 Gbit/s over 50 ms needs 6.25 MB.
        let bdp_1gbit_50ms = 1_000_000_000 / 8 * 50 / 1000;
        assert!(STREAM_WINDOW_TARGET >= bdp_1gbit_50ms);
        let mut window = credit;
        while window < STREAM_WINDOW_TARGET {
            window *= 2;
            assert!(window - credit <= room, "a stream stops growing at {window} bytes");
        }
        // Two streams reach the target together.
        assert!(2 * (STREAM_WINDOW_TARGET - credit) <= room);
        // And the bound stays a bound: at most 16 MiB more than the guaranteed minimum.
        assert!(room <= 16 * 1024 * 1024);
        // yamux accepts the settings (it asserts the minimum on both setters).
        let _ = yamux_config();
    }

    #[tokio::test]
    async fn tunnel_pump_copies_everything_in_order_and_shuts_the_writer_down() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let (c, mut d) = tokio::io::duplex(1 << 20);
        let mut counted = 0usize;
        let writer = {
            let data = data.clone();
            tokio::spawn(async move {
                tokio::io::AsyncWriteExt::write_all(&mut a, &data).await.unwrap();
            })
        };
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut d, &mut got).await.unwrap();
            got
        });
        pump(b, c, |n| {
            counted += n;
            async {}
        })
        .await;
        writer.await.unwrap();
        assert_eq!(counted, data.len());
        assert!(reader.await.unwrap() == data, "the bytes arrive whole and in order");
    }
}
