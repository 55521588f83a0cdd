//! The serve loop: bind, serve the routes, and on SIGTERM/SIGINT drain running requests up to
//! the drain timeout.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::routes::router;
use crate::state::AppState;

/// Serves until SIGTERM/SIGINT (or `stop` resolves). Then /ready turns 503 at once and new
/// requests get 503 while running ones finish (up to the drain timeout); then the listener
/// closes and the function returns.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_bound(listener.local_addr()?);
    state.spawn_drain_meter();
    let st = state.clone();
    let shutdown = async move {
        tokio::select! {
            _ = stop => {}
            _ = signal() => {}
        }
        tracing::info!("shutting down: refusing new requests, draining running ones");
        st.shutting_down.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + st.config.drain_timeout;
        loop {
            let s = st.engine.stats();
            if s.running == 0 && s.waiting == 0 {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("drain timeout reached with {} running", s.running);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    axum::serve(listener, router(state.clone())).with_graceful_shutdown(shutdown).await?;
    Ok(())
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
