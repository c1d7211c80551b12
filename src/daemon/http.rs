//! The exporter's HTTP listener (hyper, HTTP/1.1, on its own thread): `/metrics` rendered from
//! the daemon's last [`ExportState`] — never an NVML call; scrapes of one state generation share
//! one rendering —, `/-/healthy` (the daemon runs) and `/-/ready` (a first sample is in).
//!
//! Slow clients cannot blind it nor take the daemon's file descriptors: at most
//! `MAX_CONNECTIONS` connections are open at once; a client must send each request's head
//! within `HEADER_TIMEOUT` (so a silent or trickling client, or an idle kept-alive connection,
//! is closed after that long) and no connection lasts longer than `CONNECTION_LIMIT`. At the cap
//! a newcomer is still served and the oldest connection that has not sent a request yet is closed
//! instead, so a scraper that sends its request as it connects is answered even while hundreds of
//! slow clients keep (re)opening connections. (A client that opens connections faster than the
//! cap per scrape's round trip could still evict a scraper; that is a flood, not a slow client.)

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use crate::exporter::{self, ExportState};

/// The state a scrape renders, shared with the daemon's loop.
pub type Shared = Arc<Mutex<ExportState>>;

/// The last rendering: (generation, OpenMetrics, page).
type Cache = Arc<Mutex<Option<(u64, bool, Arc<String>)>>>;

/// Serves `/metrics` as `[exporter]` says, if it says to: the state to keep current, or `None`
/// (off, or the address is bad or taken: said once in the log; alerting goes on without it).
pub fn start_configured(section: &crate::exporter::ExporterSection) -> Option<Shared> {
    let addr = section.addr()?;
    let shared = Shared::default();
    let started = addr
        .map_err(|e| e.to_string())
        .and_then(|a| start(a, shared.clone()).map_err(|e| format!("{a}: {e}")));
    match started {
        Ok(bound) => {
            tracing::info!(listen = %bound, "exporter serving /metrics");
            Some(shared)
        }
        Err(e) => {
            tracing::error!("exporter: cannot listen on {e}; alerting goes on without /metrics");
            None
        }
    }
}

/// Binds `addr` now (so a taken port is reported at start) and serves on a new thread.
pub fn start(addr: SocketAddr, state: Shared) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let cache: Cache = Arc::new(Mutex::new(None));
    std::thread::Builder::new()
        .name("gpuwatch-exporter".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("exporter: cannot start: {e}");
                    return;
                }
            };
            rt.block_on(serve(listener, state, cache));
        })?;
    Ok(bound)
}

async fn serve(listener: std::net::TcpListener, state: Shared, cache: Cache) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("exporter: {e}");
            return;
        }
    };
    let open = Arc::new(Mutex::new(Open::default()));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors (or a like fault): try again a little later instead
                // of spinning on the same error.
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        // At the cap the newcomer is served and an older connection makes room (see
        // `Open::evict`): slow clients cannot hold every slot against a scraper.
        let (id, close, evicted) = {
            let mut o = lock(&open);
            let evicted = o.conns.len() >= MAX_CONNECTIONS && o.evict();
            let (id, close) = o.admit();
            (id, close, evicted)
        };
        if evicted {
            // Let the evicted connection's task run now and close its socket, so that a flood
            // of accepts cannot pile up closed-but-not-yet-dropped connections.
            tokio::task::yield_now().await;
        }
        let (state, cache, open) = (state.clone(), cache.clone(), open.clone());
        tokio::spawn(async move {
            let _slot = Slot {
                open: open.clone(),
                id,
            };
            let service = hyper::service::service_fn(move |req| {
                if let Some(c) = lock(&open).conns.get_mut(&id) {
                    c.served = true;
                }
                let response = respond(&req, &state, &cache);
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(io, service);
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_LIMIT, connection) => {}
                // Evicted: the sender was dropped.
                _ = close => {}
            }
            // `_slot` drops here (or where the task is dropped): the connection leaves `Open`.
        });
    }
}

/// The connections being served, oldest first (ids grow with each accept). Only the accept loop
/// adds; a connection leaves when its task ends (`Slot`'s drop) or when it is evicted — removing
/// an id twice is harmless, so a connection is counted out exactly once either way.
#[derive(Default)]
struct Open {
    next: u64,
    conns: BTreeMap<u64, Conn>,
}

struct Conn {
    /// A request's head has been read on this connection.
    served: bool,
    /// Dropping it closes the connection (its task stops waiting and drops the socket).
    _close: tokio::sync::oneshot::Sender<()>,
}

impl Open {
    /// A new connection: its id and what tells its task to close it.
    fn admit(&mut self) -> (u64, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let id = self.next;
        self.next += 1;
        self.conns.insert(
            id,
            Conn {
                served: false,
                _close: tx,
            },
        );
        (id, rx)
    }

    /// Closes the oldest connection that has not sent a whole request head yet — a slow client
    /// rather than a scraper, which sends its request within milliseconds of connecting and so
    /// is practically never the oldest — or, if every one has, the oldest of all.
    fn evict(&mut self) -> bool {
        let victim = self
            .conns
            .iter()
            .find(|(_, c)| !c.served)
            .or_else(|| self.conns.iter().next())
            .map(|(id, _)| *id);
        victim.is_some_and(|id| self.conns.remove(&id).is_some())
    }
}

/// A connection's place in `Open`, given up when its task ends or is dropped.
struct Slot {
    open: Arc<Mutex<Open>>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.open).conns.remove(&self.id);
    }
}

fn lock(open: &Mutex<Open>) -> std::sync::MutexGuard<'_, Open> {
    // Nothing panics while holding it; a poisoned registry is still consistent.
    open.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Connections served at once. At the cap a new connection is still served: the oldest one
/// that has not sent a request yet (or else the oldest of all) is closed to make room. Together
/// with the limits below this bounds the exporter's sockets and file descriptors.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's head (request line and headers), counted
/// from the connection's opening or, on a kept-alive connection, from the end of the previous
/// response: a scraper sends it at once; a client that sends nothing, or a byte now and then,
/// is closed after this long. It also bounds how long a kept-alive connection sits idle.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long one connection may last in all (a scrape takes milliseconds; a kept-alive one is
/// simply opened again by the next scrape).
const CONNECTION_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Pause after a failed accept.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn respond(req: &Request<Incoming>, state: &Shared, cache: &Cache) -> Response<Full<Bytes>> {
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let om = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(exporter::wants_openmetrics);
            let page = page(state, cache, om);
            let mut r = Response::new(Full::new(Bytes::from(page.as_bytes().to_vec())));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(exporter::content_type(om)),
            );
            r
        }
        "/-/healthy" => text(StatusCode::OK, "gpuwatch is healthy\n"),
        "/-/ready" => {
            let (has, stale) = state
                .lock()
                .map_or((false, false), |s| (s.snapshot.is_some(), s.stale));
            match (has, stale) {
                (true, false) => text(StatusCode::OK, "gpuwatch is ready\n"),
                (false, _) => text(StatusCode::SERVICE_UNAVAILABLE, "no sample yet\n"),
                (true, true) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no sample for several intervals (the sampler is stuck)\n",
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "gpuwatch serves /metrics, /-/healthy and /-/ready\n",
        ),
    }
}

/// The page for the current state, rendered once per state generation and format.
fn page(state: &Shared, cache: &Cache, om: bool) -> Arc<String> {
    let Ok(s) = state.lock() else {
        return Arc::new(String::new());
    };
    if let Ok(c) = cache.lock() {
        if let Some((g, o, page)) = c.as_ref() {
            if *g == s.generation && *o == om {
                return page.clone();
            }
        }
    }
    let page = Arc::new(exporter::render(&s, om));
    if let Ok(mut c) = cache.lock() {
        *c = Some((s.generation, om, page.clone()));
    }
    page
}
