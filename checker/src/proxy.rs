//! [`Proxy`]: a TCP proxy on loopback that can cut or stall every connection through it, move to
//! another server as a floating address would, or hold what clients send for a while (a client
//! farther from the server than the others).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// A TCP proxy on a free loopback port that can cut every connection through it.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    /// While true, nothing is forwarded either way and new connections wait.
    stalled: watch::Sender<bool>,
    /// While true, what the server sends is held back (what clients send goes on).
    replies_stalled: watch::Sender<bool>,
    generation: watch::Sender<u64>,
    target: Arc<Mutex<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding a free loopback port to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_delayed(target, Duration::ZERO).await
    }

    /// As [`start`](Proxy::start), and what a client sends reaches the server `delay` later
    /// (on tokio's timer, so in whole milliseconds, rounded up); the order of bytes is kept and
    /// a connection can have many commands on their way at once. Replies are not delayed.
    pub async fn start_delayed(target: SocketAddr, delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let (stalled, _) = watch::channel(false);
        let (replies_stalled, _) = watch::channel(false);
        let target = Arc::new(Mutex::new(target));
        let task = tokio::spawn({
            let target = target.clone();
            let cut = cut.clone();
            let generation = generation.clone();
            let stalled = stalled.clone();
            let replies_stalled = replies_stalled.clone();
            async move {
                loop {
                    let Ok((inbound, _)) = listener.accept().await else {
                        return;
                    };
                    // Subscribe before reading the flag: a cut between the two still reaches
                    // this connection through the signal.
                    let mut cut_signal = generation.subscribe();
                    if cut.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let stall = stalled.subscribe();
                    let replies = replies_stalled.subscribe();
                    let target = *target.lock().unwrap_or_else(|e| e.into_inner());
                    tokio::spawn(async move {
                        let forward = async move {
                            unstalled(stall.clone()).await;
                            let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                                return;
                            };
                            // As Redis clients do: small commands go out at once, not after
                            // the peer's delayed acknowledgement.
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            let (from_client, to_client) = inbound.into_split();
                            let (from_server, to_server) = outbound.into_split();
                            tokio::join!(
                                pump_delayed(from_client, to_server, stall.clone(), delay),
                                pump(from_server, to_client, stall, Some(replies)),
                            );
                        };
                        tokio::select! {
                            () = forward => {}
                            _ = cut_signal.changed() => {}
                        }
                    });
                }
            }
        });
        Self {
            port,
            cut,
            stalled,
            replies_stalled,
            generation,
            target,
            task,
        }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:PORT/` through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Closes every open connection and refuses new ones until [`restore`](Proxy::restore).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Keeps every connection open but forwards nothing, either way, until
    /// [`unstall`](Proxy::unstall): a server that accepts and never answers. New connections are
    /// accepted and wait.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwards again what a stall held back.
    pub fn unstall(&self) {
        self.stalled.send_replace(false);
    }

    /// Holds back what the server sends until [`unstall_replies`](Proxy::unstall_replies),
    /// while what clients send still reaches it: commands run, their answers come late.
    pub fn stall_replies(&self) {
        self.replies_stalled.send_replace(true);
    }

    /// Forwards the answers [`stall_replies`](Proxy::stall_replies) held back.
    pub fn unstall_replies(&self) {
        self.replies_stalled.send_replace(false);
    }

    /// Forwards new connections to `target` and closes the open ones, as a floating address
    /// that moves to another server breaks the connections to the old one.
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Resolves when the proxy is not stalled.
async fn unstalled(mut stall: watch::Receiver<bool>) {
    let _ = stall.wait_for(|stalled| !stalled).await;
}

/// Copies one direction, holding back what it read while the proxy is stalled (or, with
/// `also`, while that is raised too).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stall: watch::Receiver<bool>,
    also: Option<watch::Receiver<bool>>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        unstalled(stall.clone()).await;
        if let Some(also) = &also {
            unstalled(also.clone()).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// As [`pump`], each chunk written `delay` after it was read.
async fn pump_delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stall: watch::Receiver<bool>,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if delay.is_zero() {
        return pump(from, to, stall, None).await;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = tokio::time::Instant::now() + delay;
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            unstalled(stall.clone()).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.generation.send_modify(|g| *g += 1);
    }
}
