//! A TCP fault proxy between a runtime and a real redis-server: forwards bytes, and on command
//! adds latency, stalls (stops forwarding, holding the bytes), drops every connection, or
//! refuses new ones. It runs on its own thread and tokio runtime, so the test's clock and
//! scheduler do not affect it; it stops when dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Default)]
struct Faults {
    stalled: AtomicBool,
    refusing: AtomicBool,
    latency_ms: AtomicU64,
    /// Delay of every chunk from the server to the client only (replies, pushes).
    reply_latency_ms: AtomicU64,
    /// Latency of every connection accepted from now on, for its whole life.
    new_connection_latency_ms: AtomicU64,
    /// Bumped to drop every open connection.
    epoch: AtomicU64,
    /// Bumped to drop every open connection together with the bytes it holds back (latency):
    /// what was on its way is lost, as when a link breaks.
    lossy_epoch: AtomicU64,
    /// The port new connections are forwarded to (a failover moves it).
    upstream: AtomicU16,
    stopped: AtomicBool,
}

/// A running fault proxy on a free loopback port.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    faults: Arc<Faults>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Proxies `127.0.0.1:<free port>` to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        let faults = Arc::new(Faults::default());
        faults.upstream.store(upstream, Ordering::SeqCst);
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("binding the proxy port");
        std_listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = std_listener.local_addr().expect("address").port();
        let thread_faults = faults.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the proxy's tokio runtime");
            runtime.block_on(serve(std_listener, thread_faults));
        });
        FaultProxy {
            port,
            faults,
            thread: Some(thread),
        }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops forwarding in both directions (bytes are held, connections stay open).
    pub fn stall(&self) {
        self.faults.stalled.store(true, Ordering::SeqCst);
    }

    /// Forwards again, held bytes first.
    pub fn resume(&self) {
        self.faults.stalled.store(false, Ordering::SeqCst);
    }

    /// Closes every open connection.
    pub fn drop_connections(&self) {
        self.faults.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// As `drop_connections`, and the bytes held back by latency are lost with them instead of
    /// delivered first: a reply on its way never arrives.
    pub fn drop_connections_and_what_they_hold(&self) {
        self.faults.lossy_epoch.fetch_add(1, Ordering::SeqCst);
        self.faults.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Forwards the connections accepted from now on to `127.0.0.1:port` (those already open
    /// stay where they are: drop them to move everyone), like a virtual IP moved by a failover.
    pub fn set_upstream(&self, port: u16) {
        self.faults.upstream.store(port, Ordering::SeqCst);
    }

    /// Refuses (closes at once) new connections while `on`.
    pub fn refuse(&self, on: bool) {
        self.faults.refusing.store(on, Ordering::SeqCst);
    }

    /// Delays every chunk of the connections accepted from now on (those already open are
    /// not slowed): a reconnect is slow while the connections that stayed up are not.
    pub fn set_new_connection_latency(&self, latency: Duration) {
        self.faults
            .new_connection_latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Delays only what the server sends back: a command reaches the server at once, its
    /// answer arrives `latency` later.
    pub fn set_reply_latency(&self, latency: Duration) {
        self.faults
            .reply_latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Delays every forwarded chunk.
    pub fn set_latency(&self, latency: Duration) {
        self.faults
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.faults.stopped.store(true, Ordering::SeqCst);
        self.drop_connections();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(std_listener: std::net::TcpListener, faults: Arc<Faults>) {
    let Ok(listener) = TcpListener::from_std(std_listener) else {
        return;
    };
    while !faults.stopped.load(Ordering::SeqCst) {
        let accepted = tokio::time::timeout(Duration::from_millis(50), listener.accept()).await;
        let Ok(Ok((client, _))) = accepted else {
            continue;
        };
        if faults.refusing.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let upstream = faults.upstream.load(Ordering::SeqCst);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            continue;
        };
        let epoch = faults.epoch.load(Ordering::SeqCst);
        let own_latency = faults.new_connection_latency_ms.load(Ordering::SeqCst);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::spawn(pump(
            client_read,
            server_write,
            faults.clone(),
            epoch,
            own_latency,
            false,
        ));
        tokio::spawn(pump(
            server_read,
            client_write,
            faults.clone(),
            epoch,
            own_latency,
            true,
        ));
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: Arc<Faults>,
    epoch: u64,
    own_latency_ms: u64,
    replies: bool,
) {
    let alive = |f: &Faults| f.epoch.load(Ordering::SeqCst) == epoch;
    let lossy_epoch = faults.lossy_epoch.load(Ordering::SeqCst);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::time::timeout(Duration::from_millis(20), from.read(&mut buf)).await;
        if !alive(&faults) {
            return;
        }
        let n = match read {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        while faults.stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if !alive(&faults) {
                return;
            }
        }
        let mut latency = faults.latency_ms.load(Ordering::SeqCst) + own_latency_ms;
        if replies {
            latency += faults.reply_latency_ms.load(Ordering::SeqCst);
        }
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
            if faults.lossy_epoch.load(Ordering::SeqCst) != lossy_epoch {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
