//! The exporter's HTTP listener (hyper, HTTP/1.1, on its own thread): `/metrics` rendered from
//! the daemon's last [`ExportState`] — never an NVML call; scrapes of one state generation share
//! one rendering —, `/-/healthy` (the daemon runs) and `/-/ready` (a first sample is in).

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
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
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
        // Clients that open connections and send nothing must not take the daemon's file
        // descriptors (its state, outbox and sockets need them): a bounded number of
        // connections, each for a bounded time.
        if open.load(std::sync::atomic::Ordering::SeqCst) >= MAX_CONNECTIONS {
            drop(stream);
            continue;
        }
        open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (state, cache, open) = (state.clone(), cache.clone(), open.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = respond(&req, &state, &cache);
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let connection =
                hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, connection).await;
            open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 64;
/// How long one connection may last (a scrape takes milliseconds; a kept-alive one is simply
/// opened again by the next scrape).
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
