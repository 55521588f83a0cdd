//! The serve loop: accept connections (each must send its request head within the header-read
//! timeout), serve the routes, and on SIGTERM/SIGINT drain — for at most `--drain-timeout`.
//!
//! Drain: /ready turns 503 at once, new requests get 503, the listener closes, idle keep-alive
//! connections are told to close, running requests finish. When the drain timeout passes, what
//! is still open is cut (a log line says how many connections and sequences) and the function
//! returns, so the process always exits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

use crate::routes::{ops_router, router};
use crate::state::AppState;

/// Serves until SIGTERM/SIGINT (or `stop` resolves), then drains as the module says.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_bound(listener.local_addr()?);
    state.spawn_drain_meter();
    state.experiments.spawn();
    reload_keys_on_sighup(state.config.keys.clone());
    let app = router(state.clone());
    let mut http = Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(state.config.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    tokio::pin!(stop);
    let signal = signal();
    tokio::pin!(signal);
    let mut died = None;
    loop {
        let (stream, _) = tokio::select! {
            conn = listener.accept() => match conn {
                Ok(c) => c,
                Err(e) => {
                    // out of file descriptors and the like: keep serving the connections we have
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
            _ = &mut signal => break,
            cause = engine_died(&state) => {
                died = Some(cause);
                break;
            }
        };
        // answers are streamed in small writes (one SSE event per token): without TCP_NODELAY,
        // Nagle's algorithm holds each write until the client's delayed ACK (40 ms on Linux) —
        // measured: +43 ms to the first token of every streamed answer (docs/benchmarks.md)
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection_with_upgrades(
            TokioIo::new(stream),
            TowerToHyperService::new(app.clone()),
        );
        let conn = graceful.watch(conn.into_owned());
        let open = open.clone();
        open.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let _ = conn.await;
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
    drop(listener);
    if let Some(cause) = died {
        // every request in flight was already answered with the error; a supervisor restarts us
        tracing::error!("{cause}; stopping with an error");
        state.shutting_down.store(true, Ordering::SeqCst);
        drain(&state, graceful, &open).await;
        anyhow::bail!("{cause}");
    }
    drain(&state, graceful, &open).await;
    Ok(())
}

/// Resolves once a model can no longer answer (an engine thread died; it does not stop before
/// the server does), with the cause it left.
async fn engine_died(state: &AppState) -> String {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
        if let Some((id, why)) = state
            .models
            .iter()
            .find_map(|m| m.alive().err().map(|why| (&m.id, why)))
        {
            return format!("model '{id}': {why}");
        }
    }
}

/// Serves [`ops_router`] on `listener` until `stop` resolves, with the same request-head timeout
/// as [`serve`]; then closes (probes and scrapes are short: open connections get a second). The
/// caller owns shutting down: it sets [`AppState::shutting_down`] when it starts to drain its own
/// work, so that `/ready` answers 503 while `/metrics` keeps answering.
pub async fn serve_ops(
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()>,
) {
    let app = ops_router(state.clone());
    let mut http = Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(state.config.header_read_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            conn = listener.accept() => match conn {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        // answers are streamed in small writes (one SSE event per token): without TCP_NODELAY,
        // Nagle's algorithm holds each write until the client's delayed ACK (40 ms on Linux) —
        // measured: +43 ms to the first token of every streamed answer (docs/benchmarks.md)
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection_with_upgrades(
            TokioIo::new(stream),
            TowerToHyperService::new(app.clone()),
        );
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
}

/// Refuses new work, then waits for running requests and open connections up to the drain
/// timeout; past it, logs what is cut.
async fn drain(state: &AppState, graceful: GracefulShutdown, open: &AtomicUsize) {
    tracing::info!(
        "shutting down: refusing new requests, draining running ones (up to {:?})",
        state.config.drain_timeout
    );
    state.shutting_down.store(true, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + state.config.drain_timeout;
    // requests in the engine first: their connections close once the answers are out
    loop {
        let busy = state
            .models
            .iter()
            .map(|m| m.stats())
            .any(|s| s.running > 0 || s.waiting > 0);
        if !busy || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match tokio::time::timeout_at(deadline, graceful.shutdown()).await {
        Ok(()) => tracing::info!("drained: every connection closed"),
        Err(_) => {
            let (running, waiting) = state
                .models
                .iter()
                .map(|m| m.stats())
                .fold((0, 0), |(r, w), s| (r + s.running, w + s.waiting));
            tracing::warn!(
                "drain timeout of {:?} reached: cutting {} open connections ({} sequences running, {} waiting)",
                state.config.drain_timeout,
                open.load(Ordering::SeqCst),
                running,
                waiting
            );
        }
    }
}

/// SIGHUP reads the keys file again (it is also read again whenever it changes).
fn reload_keys_on_sighup(keys: Arc<crate::keys::Keys>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!(
            "SIGHUP cannot be watched: the keys file is read again only when it changes"
        );
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            // the outcome is logged by `reload`
            let _ = keys.reload();
        }
    });
}

async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
