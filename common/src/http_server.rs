//! The one HTTP server of every daemon: the authority's control API and the enactor's and
//! planner's own metrics listeners. It serves an axum `Router` over HTTP/1.1 with hyper's
//! connection and tower(-http) layers, with bounds on what clients can hold (`Limits`):
//!
//! - At most `connections_max` connections: at the cap the server stops accepting, and new
//!   connections wait in the kernel's accept queue (which costs no descriptor of ours) until
//!   one closes.
//! - hyper's header read timeout: a connection must deliver a complete request head within
//!   `header_timeout` of being accepted or of its previous answer, so both half-sent requests
//!   and idle keep-alive connections are closed.
//! - tower-http's body timeout: a request body that sends nothing for `body_timeout` fails
//!   (a 4xx answer, then the connection closes).
//! - tower-http's request timeout, `request_timeout`: a request that takes longer, body and
//!   handler included, gets 503. It bounds a slowly trickled body and a stuck handler.
//! - Failed accepts back off (`accept::Acceptor`), are counted and rarely logged.
//! - With TLS (`serve_tls`), the handshake must end within `header_timeout` too; a failed one
//!   is counted (`tls_failures`) and logged at debug (it is the client's). The certificate a
//!   client presented goes with each of its requests (`tls::PeerCertificate`).
//!
//! axum's own `serve` has none of these: it sets no timer for hyper and accepts every
//! connection. What is served (routes, authentication, limits on particular routes) is the
//! caller's.

use crate::accept::Acceptor;
use crate::tls::PeerCertificate;
use axum::Router;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};

/// What a client may hold; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Invariant (checked by `serve`): at least 1.
    pub connections_max: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Also the longest `serve` waits at shutdown for requests in flight.
    pub request_timeout: Duration,
}

impl Limits {
    /// A daemon's own metrics listener (`/metrics`, `/healthz`, the planner's `/v1/status`).
    /// A few scrapers and a person with curl need a handful of connections; 64 leave room
    /// for bursts and cost 64 descriptors of a limit every daemon raises to the hard one.
    /// Scrapers send a request in one write and read a page rendered from memory, so 10 s
    /// for a request head or a pause in a body and 30 s for the whole request are generous.
    pub const METRICS: Limits = Limits {
        connections_max: 64,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
    };
}

/// A server's connections: failed accepts, connections open.
#[derive(Clone, Debug, Default)]
pub struct ServerMetrics {
    pub accept_errors: Counter,
    pub open: Gauge,
    /// TLS handshakes that failed or timed out (`serve_tls`); registered by its caller.
    pub tls_failures: Counter,
}

impl ServerMetrics {
    /// Registers `<name>_accept_errors` (`_total`) and `<name>_connections` in `registry`;
    /// `what` names the server in their help texts.
    pub fn register(&self, registry: &mut Registry, name: &str, what: &str) {
        registry.register(
            format!("{name}_accept_errors"),
            format!("{what} accepts that failed (out of descriptors or memory, or the peer reset first)"),
            self.accept_errors.clone(),
        );
        registry.register(format!("{name}_connections"), format!("{what} connections open"), self.open.clone());
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting, lets requests
/// in flight finish (for at most `limits.request_timeout`) and closes idle connections.
/// `what` names the server in log lines, e.g. "control API".
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: ServerMetrics,
    what: &'static str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    serve_tls(listener, app, limits, metrics, what, None, shutdown).await
}

/// As `serve`, over TLS when `tls` is given: each connection is accepted with the
/// `ServerConfig` in force when it came.
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: ServerMetrics,
    what: &'static str,
    tls: Option<crate::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    assert!(limits.connections_max >= 1);
    let service = tower::ServiceBuilder::new()
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limits.request_timeout))
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        .service(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let graceful = GracefulShutdown::new();
    let mut acceptor = Acceptor::new(listener, what, metrics.accept_errors.clone());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Take a slot first: at the cap, new connections wait in the kernel's queue.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit,
            () = &mut shutdown => break,
        };
        // Invariant: the semaphore is never closed.
        let Ok(permit) = permit else { break };
        let (stream, _peer) = tokio::select! {
            conn = acceptor.accept() => conn,
            () = &mut shutdown => break,
        };
        let open = metrics.open.clone();
        open.inc();
        let (watcher, http, service) = (graceful.watcher(), http.clone(), service.clone());
        let handshake = tls.as_ref().map(|tls| (tokio_rustls::TlsAcceptor::from(tls.load_full()), metrics.tls_failures.clone()));
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            // Errors are the client's (it went away, sent garbage, or timed out).
            let ended = match handshake {
                None => watcher.watch(http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))).await,
                Some((acceptor, failures)) => match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let peer = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| PeerCertificate(Arc::new(c.clone().into_owned())));
                        let service =
                            tower::ServiceExt::map_request(service, move |mut req: axum::http::Request<hyper::body::Incoming>| {
                                if let Some(peer) = &peer {
                                    req.extensions_mut().insert(peer.clone());
                                }
                                req
                            });
                        watcher.watch(http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))).await
                    }
                    Ok(Err(err)) => {
                        failures.inc();
                        tracing::debug!(listener = what, %err, "TLS handshake failed");
                        Ok(())
                    }
                    Err(_) => {
                        failures.inc();
                        tracing::debug!(listener = what, "TLS handshake timed out");
                        Ok(())
                    }
                },
            };
            if let Err(err) = ended {
                tracing::debug!(listener = what, %err, "HTTP connection ended");
            }
            open.dec();
            drop(permit);
        });
    }
    drop(acceptor);
    if tokio::time::timeout(limits.request_timeout, graceful.shutdown()).await.is_err() {
        tracing::warn!(
            listener = what,
            after_secs = limits.request_timeout.as_secs(),
            "HTTP connections still open at shutdown; closing them"
        );
    }
}

#[cfg(test)]
mod tests {
    //! The bounds over real TCP, with a raw client: each test failed with `axum::serve` in
    //! place of `serve` (checked once), which holds half-sent requests and idle connections
    //! for as long as the client likes and accepts every connection.

    use super::*;
    use axum::routing::{get, post};
    use std::net::SocketAddr;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// How long anything we wait for may take; far more than it needs.
    const DEADLINE: Duration = Duration::from_secs(30);
    const REQUEST: &[u8] = b"GET /hello HTTP/1.1\r\nHost: test\r\n\r\n";

    struct Server {
        addr: SocketAddr,
        metrics: ServerMetrics,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Server {
        /// `GET /hello` answers at once, `POST /echo` reads its body, `GET /stuck` never answers.
        async fn start(limits: Limits) -> Server {
            let app = Router::new()
                .route("/hello", get(|| async { "hello\n" }))
                .route("/echo", post(|body: String| async move { body }))
                .route("/stuck", get(std::future::pending::<&'static str>));
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds loopback port 0");
            let addr = listener.local_addr().expect("bound");
            let metrics = ServerMetrics::default();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(serve(listener, app, limits, metrics.clone(), "test", async move {
                let _ = stopped.await;
            }));
            Server { addr, metrics, stop: Some(stop), task }
        }

        async fn stop(mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            tokio::time::timeout(DEADLINE, &mut self.task).await.expect("stops in time").expect("no panic");
        }
    }

    fn limits(connections_max: usize, header_secs: u64) -> Limits {
        Limits {
            connections_max,
            header_timeout: Duration::from_secs(header_secs),
            body_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
        }
    }

    /// Reads until the server closes the connection (end of file or reset); `Err` on timeout.
    async fn closed_within(stream: &mut TcpStream, wait: Duration) -> Result<Vec<u8>, tokio::time::error::Elapsed> {
        tokio::time::timeout(wait, async {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return seen,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
    }

    /// Reads one whole response with a `content-length`.
    async fn read_response(stream: &mut TcpStream) -> String {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await.expect("an answer in time").expect("reads");
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()));
                if length.and_then(|l| l.parse::<usize>().ok()).is_some_and(|len| body.len() >= len) {
                    return text;
                }
            }
        }
    }

    async fn hello(addr: SocketAddr) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        stream.write_all(REQUEST).await.expect("writes");
        read_response(&mut stream).await
    }

    /// Half-sent request heads are all closed after the header timeout, and a whole request is
    /// answered meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_sent_requests_are_closed_after_the_header_timeout() {
        let server = Server::start(limits(64, 1)).await;
        let started = Instant::now();
        let mut held = Vec::new();
        for _ in 0..32 {
            let mut stream = TcpStream::connect(server.addr).await.expect("connects");
            stream.write_all(b"GET /hello HTTP/1.1\r\nHost: te").await.expect("writes");
            held.push(stream);
        }
        assert!(hello(server.addr).await.starts_with("HTTP/1.1 200"));
        let deadline = Instant::now() + DEADLINE;
        for (i, stream) in held.iter_mut().enumerate() {
            let closed = closed_within(stream, deadline.saturating_duration_since(Instant::now())).await;
            assert!(closed.is_ok(), "half-sent request {i} still open after {DEADLINE:?}");
        }
        assert!(started.elapsed() >= Duration::from_secs(1), "closed before the timeout");
        server.stop().await;
    }

    /// A keep-alive connection that sends nothing after its answer is closed after the header
    /// timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_keep_alive_connections_are_closed() {
        let server = Server::start(limits(64, 1)).await;
        let mut stream = TcpStream::connect(server.addr).await.expect("connects");
        stream.write_all(REQUEST).await.expect("writes");
        assert!(read_response(&mut stream).await.starts_with("HTTP/1.1 200"));
        assert!(closed_within(&mut stream, DEADLINE).await.is_ok(), "the idle connection is still open after {DEADLINE:?}");
        server.stop().await;
    }

    /// A body that stops coming fails after the body timeout and its connection closes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_sent_bodies_time_out() {
        let server = Server::start(limits(64, 60)).await;
        let mut stream = TcpStream::connect(server.addr).await.expect("connects");
        stream.write_all(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\nhalf").await.expect("writes");
        let seen = closed_within(&mut stream, DEADLINE).await.expect("the half-sent body was held");
        let text = String::from_utf8_lossy(&seen);
        assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");
        server.stop().await;
    }

    /// A handler that does not answer within the request timeout gets 503.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_end_after_the_request_timeout() {
        let server = Server::start(limits(64, 60)).await;
        let mut stream = TcpStream::connect(server.addr).await.expect("connects");
        stream.write_all(b"GET /stuck HTTP/1.1\r\nHost: test\r\n\r\n").await.expect("writes");
        let answer = read_response(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        server.stop().await;
    }

    /// With `connections_max` connections open the next one is not served until one closes,
    /// and the open connections are counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_over_the_cap_wait_for_a_free_slot() {
        const CAP: usize = 4;
        let server = Server::start(limits(CAP, 60)).await;
        let mut open = Vec::new();
        for _ in 0..CAP {
            let mut stream = TcpStream::connect(server.addr).await.expect("connects");
            stream.write_all(REQUEST).await.expect("writes");
            read_response(&mut stream).await;
            open.push(stream);
        }
        // The kernel completes the handshake; the server does not take the connection yet.
        let mut waiting = TcpStream::connect(server.addr).await.expect("connects");
        waiting.write_all(REQUEST).await.expect("writes");
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut byte)).await;
        assert!(early.is_err(), "a connection over the cap was served: {early:?}");
        assert_eq!(server.metrics.open.get(), CAP as i64, "open connections counted");
        drop(open.pop());
        assert!(read_response(&mut waiting).await.starts_with("HTTP/1.1 200"));
        drop(open);
        server.stop().await;
    }
}
