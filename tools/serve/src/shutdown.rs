//! Graceful stop. On the shutdown signal the server stops accepting connections and new
//! requests (503 on connections already open), lets running requests finish, and after the
//! drain timeout ends those still running: a stream then gets an error event naming the
//! shutdown and, for OpenAI streams, its closing `[DONE]`. The server returns once every
//! connection has closed.

use crate::http::{router, AppState};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Serves `state` on `listener` until `signal` resolves, then drains for at most `drain`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    signal: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let app = router(state.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            signal.await;
            begin_drain(&state, drain);
        })
        .await
}

/// Marks the server as draining and ends what still runs after `drain`.
pub fn begin_drain(state: &Arc<AppState>, drain: Duration) {
    let running = state.start_draining();
    eprintln!(
        "fastllm serve: shutting down: {running} requests running, waiting up to {:.1} s for them",
        drain.as_secs_f64()
    );
    let st = state.clone();
    tokio::spawn(async move {
        tokio::time::sleep(drain).await;
        st.end_running();
    });
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C). A signal that cannot be listened to is
/// not waited for.
pub async fn signal() {
    let int = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = int => {}
        _ = term => {}
    }
}
