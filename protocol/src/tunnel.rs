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

/// The connection yamux runs over: `io` with a read buffer of [`CONNECTION_READ_BUFFER`] and a
/// write buffer of [`CONNECTION_WRITE_BUFFER`], each allocated only while bytes move
/// ([`LazyBuffered`]): an idle tunnel holds neither.
pub fn buffered<T: tokio::io::AsyncRead + tokio::io::AsyncWrite>(io: T) -> LazyBuffered<T> {
    LazyBuffered::new(io)
}

/// A buffered stream whose buffers exist only while bytes move through them. The read buffer is
/// allocated when a read smaller than it is asked for and let go of when it is empty and the
/// stream has nothing more to read now (`Pending`); the write buffer is allocated by the first
/// small write and let go of once a flush has written it out. yamux flushes after every frame
/// and reads until `Pending`, so a connected tunnel with no traffic holds no buffer (before: a
/// `tokio::io::BufStream` of 129 KiB, zeroed and so resident, per connected node at the relay
/// and in the agent). The write buffer is not zeroed (writes extend it); the read buffer is,
/// before each fill (safe code reads only into initialized bytes).
pub struct LazyBuffered<T> {
    inner: T,
    /// Read bytes not yet handed out: `rbuf[rpos..]`.
    rbuf: Vec<u8>,
    rpos: usize,
    /// Bytes written but not yet passed on: `wbuf[wpos..]` (`wpos` of them already were).
    wbuf: Vec<u8>,
    wpos: usize,
}

impl<T> LazyBuffered<T> {
    pub fn new(inner: T) -> Self {
        LazyBuffered { inner, rbuf: Vec::new(), rpos: 0, wbuf: Vec::new(), wpos: 0 }
    }

    /// The bytes its buffers hold allocated now (both together).
    pub fn held(&self) -> usize {
        self.rbuf.capacity() + self.wbuf.capacity()
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> LazyBuffered<T> {
    /// Writes the write buffer out; lets go of it once empty.
    fn poll_drain(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        while self.wpos < self.wbuf.len() {
            match std::pin::Pin::new(&mut self.inner).poll_write(cx, &self.wbuf[self.wpos..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.wpos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.wbuf = Vec::new();
        self.wpos = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LazyBuffered<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.rpos == this.rbuf.len() {
            // Nothing buffered: a large read goes straight through, a small one fills the buffer.
            if out.remaining() >= CONNECTION_READ_BUFFER {
                this.rbuf = Vec::new();
                this.rpos = 0;
                return std::pin::Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let mut buf = std::mem::take(&mut this.rbuf);
            buf.resize(CONNECTION_READ_BUFFER, 0);
            this.rpos = 0;
            let mut rb = tokio::io::ReadBuf::new(&mut buf);
            match std::pin::Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    buf.truncate(n);
                    this.rbuf = buf;
                }
                // Failed, or idle: hold nothing while waiting.
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = out.remaining().min(this.rbuf.len() - this.rpos);
        out.put_slice(&this.rbuf[this.rpos..this.rpos + n]);
        this.rpos += n;
        Poll::Ready(Ok(()))
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for LazyBuffered<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.wbuf.len() + data.len() > CONNECTION_WRITE_BUFFER {
            match this.poll_drain(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other.map(|r| r.map(|()| 0)),
            }
        }
        if data.len() >= CONNECTION_WRITE_BUFFER {
            return std::pin::Pin::new(&mut this.inner).poll_write(cx, data);
        }
        if this.wbuf.capacity() == 0 {
            this.wbuf.reserve_exact(CONNECTION_WRITE_BUFFER);
        }
        this.wbuf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_shutdown(cx)
    }
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

/// Short reads in a row (each under a quarter of the buffer) after which a [`CopyBuffer`] halves.
pub const COPY_BUFFER_SHORT_READS: u8 = 4;

/// The rule of a [`CopyBuffer`]: its size for the next read, after a read of `n` bytes into
/// `len`, with `short` short reads in a row before this one; returns the size and the new count.
/// A read that fills the buffer doubles it (up to [`COPY_BUFFER_MAX`]); a read of under a
/// quarter of it is a short read, and [`COPY_BUFFER_SHORT_READS`] of them in a row halve it (down
/// to [`COPY_BUFFER_MIN`]); anything else keeps it. One short read in a bulk transfer (the
/// sender's window update late by a moment, a TCP segment alone) no longer throws the buffer
/// back to its smallest, to double six times again; a stream that went quiet still comes down,
/// one halving per few reads.
pub fn copy_buffer_next(len: usize, n: usize, short: u8) -> (usize, u8) {
    if n >= len {
        ((len * 2).min(COPY_BUFFER_MAX), 0)
    } else if n < len / 4 {
        if short + 1 >= COPY_BUFFER_SHORT_READS {
            ((len / 2).max(COPY_BUFFER_MIN), 0)
        } else {
            (len, short + 1)
        }
    } else {
        (len, 0)
    }
}

/// One direction's buffer of a stream that grows while data flows and shrinks when it does
/// not ([`copy_buffer_next`]): from [`COPY_BUFFER_MIN`] up to [`COPY_BUFFER_MAX`]. So a bulk
/// transfer moves large chunks (fewer frames, wake-ups and flushes per byte), while an idle or
/// interactive stream holds a few KiB. It grows in place (the bytes already there are never
/// copied: they were written out before it grows).
pub struct CopyBuffer {
    buf: Vec<u8>,
    short: u8,
}

impl Default for CopyBuffer {
    fn default() -> Self {
        CopyBuffer { buf: vec![0; COPY_BUFFER_MIN], short: 0 }
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
        let (len, short) = copy_buffer_next(self.buf.len(), n, self.short);
        self.short = short;
        if len > self.buf.len() {
            self.buf.resize(len, 0);
        } else if len < self.buf.len() {
            self.buf.truncate(len);
            self.buf.shrink_to_fit();
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
        assert_eq!(b.capacity(), COPY_BUFFER_MAX, "one short read in a transfer keeps the buffer");
        for _ in 0..40 {
            b.adapt(10);
        }
        assert_eq!(b.capacity(), COPY_BUFFER_MIN, "the flow stopped: back to small");
    }

    #[test]
    fn copy_buffer_next_halves_only_after_several_short_reads_in_a_row() {
        let max = COPY_BUFFER_MAX;
        // Short reads not in a row never shrink it.
        let (mut len, mut short) = (max, 0);
        for _ in 0..100 {
            (len, short) = copy_buffer_next(len, 1, short);
            (len, short) = copy_buffer_next(len, max / 2, short);
        }
        assert_eq!(len, max);
        // COPY_BUFFER_SHORT_READS in a row halve it once.
        let mut short = 0;
        let mut len = max;
        for i in 1..=COPY_BUFFER_SHORT_READS {
            (len, short) = copy_buffer_next(len, 1, short);
            assert_eq!(len, if i < COPY_BUFFER_SHORT_READS { max } else { max / 2 });
        }
        assert_eq!(short, 0);
    }

    proptest::proptest! {
        #[test]
        fn copy_buffer_next_stays_in_bounds_and_grows_only_when_filled(
            exp in 0u32..7, n in 0usize..600_000, short in 0u8..COPY_BUFFER_SHORT_READS,
        ) {
            let len = COPY_BUFFER_MIN << exp;
            let (next, s) = copy_buffer_next(len, n, short);
            proptest::prop_assert!((COPY_BUFFER_MIN..=COPY_BUFFER_MAX).contains(&next));
            proptest::prop_assert!(s < COPY_BUFFER_SHORT_READS);
            if next > len { proptest::prop_assert!(n >= len); }
            if next < len { proptest::prop_assert!(n < len / 4 && next == len / 2); }
        }
    }

    #[tokio::test]
    async fn relay_an_idle_tunnel_holds_at_most_16_kib() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, b) = tokio::io::duplex(1 << 20);
        let (mut a, mut b) = (buffered(a), buffered(b));
        // A frame's header and body, written small and flushed, then read as yamux reads them.
        for _ in 0..3 {
            a.write_all(&[7u8; 12]).await.unwrap();
            a.write_all(&[1u8; 40_000]).await.unwrap();
            a.flush().await.unwrap();
            let mut head = [0u8; 12];
            b.read_exact(&mut head).await.unwrap();
            let mut body = vec![0u8; 40_000];
            b.read_exact(&mut body).await.unwrap();
            assert!(head == [7; 12] && body.iter().all(|&x| x == 1));
        }
        // Idle: the reader waits (Pending), the writer has flushed.
        let mut one = [0u8; 1];
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), b.read(&mut one)).await;
        assert!(waited.is_err(), "nothing more to read");
        assert!(a.held() + b.held() <= 16 * 1024, "held {} + {}", a.held(), b.held());
        // Large writes and reads pass straight through, bytes intact.
        let big = vec![3u8; 200_000];
        a.write_all(&big).await.unwrap();
        a.flush().await.unwrap();
        let mut got = vec![0u8; 200_000];
        b.read_exact(&mut got).await.unwrap();
        assert!(got == big);
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
