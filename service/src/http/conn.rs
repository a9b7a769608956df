//! Connections the service accepts: a bounded number, each with deadlines.
//!
//! 20,000 idle connections once exhausted the service's file descriptors:
//! nothing bounded how many it held or how long a connection could sit
//! without sending its request. Here accepting waits for one of
//! [`MAX_CONNECTIONS`] slots, every request's headers must arrive within
//! [`HEADER_TIMEOUT`] (the first request's from accepting, each later
//! one's from its first byte), and a connection that neither reads nor
//! writes for [`IDLE_TIMEOUT`] is closed (an event stream writes a
//! keep-alive every 15 s, so it stays open). Once only the first request
//! had a header deadline, 256 connections sending a second request a byte
//! every 20 s held every slot for good.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connections held at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 256;
/// Time a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a connection may neither read nor write before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How an interim (1xx) response's status line begins.
const INTERIM_STATUS: &[u8] = b"HTTP/1.1 1";

/// A TCP listener with a connection cap and per-connection deadlines.
pub struct Guarded {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    limits: Limits,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub connections: usize,
    pub header: Duration,
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: MAX_CONNECTIONS,
            header: HEADER_TIMEOUT,
            idle: IDLE_TIMEOUT,
        }
    }
}

impl Guarded {
    pub fn new(listener: TcpListener, limits: Limits) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(limits.connections.max(1))),
            limits,
        }
    }
}

impl axum::serve::Listener for Guarded {
    type Io = GuardedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok(slot) = Arc::clone(&self.slots).acquire_owned().await else {
                // The semaphore is never closed; wait as if it were full.
                std::future::pending::<()>().await;
                continue;
            };
            match self.listener.accept().await {
                Ok((stream, addr)) => return (GuardedStream::new(stream, slot, self.limits), addr),
                Err(e) => {
                    // Out of descriptors and the like: back off, as axum does.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// An accepted connection holding its slot until it closes.
pub struct GuardedStream {
    inner: TcpStream,
    _slot: OwnedSemaphorePermit,
    limits: Limits,
    /// When the headers being read began to arrive (or the connection was
    /// accepted, for the first request).
    headers_since: Instant,
    last_activity: Instant,
    /// Bytes of `\r\n\r\n` matched so far; 4 once a request's headers are in.
    header_end: u8,
    /// Whether a response has been written since the last headers came in:
    /// the next byte read begins another request.
    responded: bool,
    timer: Pin<Box<Sleep>>,
}

impl GuardedStream {
    fn new(inner: TcpStream, slot: OwnedSemaphorePermit, limits: Limits) -> Self {
        let now = Instant::now();
        Self {
            inner,
            _slot: slot,
            limits,
            headers_since: now,
            last_activity: now,
            header_end: 0,
            responded: false,
            timer: Box::pin(tokio::time::sleep_until(now + limits.header)),
        }
    }

    fn deadline(&self) -> Instant {
        if self.header_end < 4 {
            self.headers_since + self.limits.header
        } else {
            self.last_activity + self.limits.idle
        }
    }

    fn saw(&mut self, bytes: &[u8]) {
        const END: &[u8; 4] = b"\r\n\r\n";
        for &b in bytes {
            if self.header_end >= 4 {
                return;
            }
            let at = usize::from(self.header_end);
            self.header_end = if b == END[at] {
                self.header_end + 1
            } else {
                u8::from(b == END[0])
            };
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut me.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    me.last_activity = Instant::now();
                    if me.responded {
                        me.responded = false;
                        me.header_end = 0;
                        me.headers_since = me.last_activity;
                    }
                    if me.header_end < 4 {
                        me.saw(&buf.filled()[before..]);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let deadline = me.deadline();
                if me.timer.deadline() != deadline {
                    me.timer.as_mut().reset(deadline);
                }
                match me.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        if me.header_end < 4 {
                            "no request headers in time"
                        } else {
                            "connection idle"
                        },
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let out = Pin::new(&mut me.inner).poll_write(cx, buf);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            me.last_activity = Instant::now();
            // An interim `100 Continue` is no answer: the body follows it.
            if me.header_end == 4 && !buf.starts_with(INTERIM_STATUS) {
                me.responded = true;
            }
        }
        out
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn served(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let guarded = Guarded::new(listener, limits);
        let addr = axum::serve::Listener::local_addr(&guarded).unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(guarded, app).await });
        addr
    }

    async fn get(addr: SocketAddr) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        let _ = c.read_to_string(&mut reply).await;
        reply
    }

    #[tokio::test]
    async fn silent_connections_are_closed_and_do_not_hold_slots() {
        let limits = Limits {
            connections: 2,
            header: Duration::from_millis(200),
            idle: Duration::from_millis(400),
        };
        let addr = served(limits).await;
        // Two connections that never send take both slots, then time out.
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let started = Instant::now();
        let reply = get(addr).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "waited for a slot"
        );
        for mut c in idle {
            let mut buf = [0u8; 16];
            assert_eq!(
                c.read(&mut buf).await.unwrap_or(0),
                0,
                "closed by the service"
            );
        }
    }

    #[tokio::test]
    async fn every_request_on_a_connection_has_a_header_deadline() {
        let limits = Limits {
            connections: 4,
            header: Duration::from_millis(300),
            idle: Duration::from_secs(5),
        };
        let addr = served(limits).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = [0u8; 1024];
        c.write_all(request).await.unwrap();
        assert!(c.read(&mut buf).await.unwrap() > 0);
        // A pause between requests is only idle time...
        tokio::time::sleep(Duration::from_millis(600)).await;
        c.write_all(request).await.unwrap();
        let n = c.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "kept alive");
        // ...but a next request dripped a byte at a time is cut off.
        let started = Instant::now();
        let mut closed = false;
        for &b in request.iter() {
            if c.write_all(&[b]).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(1), c.read(&mut buf)).await;
        closed |= matches!(read, Ok(Ok(0) | Err(_)));
        assert!(closed, "a dripped second request was closed");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn headers_are_found_across_reads() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move { TcpStream::connect(addr).await.unwrap() });
        let (stream, _) = listener.accept().await.unwrap();
        let _client = client.await.unwrap();
        let slot = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        let mut s = GuardedStream::new(stream, slot, Limits::default());
        for part in [&b"GET / HTTP/1.1\r\nHost: x\r"[..], b"\n\r", b"\n"] {
            assert!(s.header_end < 4);
            s.saw(part);
        }
        assert_eq!(s.header_end, 4);
    }
}
