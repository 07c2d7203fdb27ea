//! The control API's front door, bound and answering from the first moment: before the store
//! is reached (etcd down at start) it answers `/healthz`, `/readyz` and `/metrics` from the
//! process's own state and every other route with a quick 503 naming the store, instead of
//! letting connections wait; once the store is reached, every request goes to the full router.
//!
//! Why: an orchestrator health-checks `/readyz` with a short timeout. A health check that
//! waits on the control plane would turn an etcd outage into a DNS outage: the authority,
//! serving its saved state, would be marked unhealthy and restarted.
//!
//! `/readyz` means "answering DNS from a loaded state"; whether the store answers is a separate
//! field (`store`), and the metric `dnsplan_store_reachable`.
//!
//! Not here: the routes themselves (`routes`), the HTTP server (`server`).

use crate::metrics::Metrics;
use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dnsplan_common::daemon::Reachability;
use dnsplan_common::store::wire::{ErrorBody, WireError};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// What `/readyz` answers, as JSON, with 200 when `ready` and 503 otherwise.
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// DNS answers from a loaded state (saved on disk, or read from the store).
    pub ready: bool,
    /// `reachable` or `unreachable`: whether the store answered its last call.
    pub store: &'static str,
}

/// What `/readyz` reads: whether DNS answers and whether the store does. The full router's
/// `/readyz` holds this, not the `Gate`, which holds the full router (no cycle, so the store
/// is closed when the authority stops).
#[derive(Clone)]
pub struct Ready {
    /// Whether DNS answers (a state is loaded).
    dns_ready: Arc<AtomicBool>,
    store: Arc<Reachability>,
    metrics: Arc<Metrics>,
}

impl Ready {
    pub fn readiness(&self) -> (StatusCode, axum::Json<Readiness>) {
        let ready = self.dns_ready.load(Ordering::Relaxed);
        let store = if self.store.is_down() { "unreachable" } else { "reachable" };
        self.metrics.observe_store_reachable(!self.store.is_down());
        let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        (status, axum::Json(Readiness { ready, store }))
    }
}

/// The shared state of the front door.
#[derive(Clone)]
pub struct Gate {
    /// The full router, once the store is reached.
    full: Arc<OnceLock<Router>>,
    ready: Ready,
}

impl Gate {
    /// A gate for a process whose store has not answered yet (`store` says so until it does).
    pub fn new(store: Arc<Reachability>, metrics: Arc<Metrics>) -> Gate {
        Gate { full: Arc::default(), ready: Ready { dns_ready: Arc::default(), store, metrics } }
    }

    /// DNS answers from a loaded state from now on.
    pub fn dns_ready(&self) {
        self.ready.dns_ready.store(true, Ordering::Relaxed);
    }

    /// What the full router's `/readyz` answers from.
    pub fn ready(&self) -> Ready {
        self.ready.clone()
    }

    /// Every request goes to `full` from now on.
    pub fn open(&self, full: Router) {
        let _ = self.full.set(full);
    }

    /// The router to serve from the start. Framework refusals get the JSON error body here,
    /// outermost, whatever routes the full router merged in (`dnsplan up` adds its own).
    pub fn router(&self) -> Router {
        let gate = self.clone();
        Router::new()
            .fallback(move |request: Request| {
                let gate = gate.clone();
                async move { gate.answer(request).await }
            })
            .layer(axum::middleware::map_response(crate::control::routes::json_for_framework_errors))
    }

    async fn answer(&self, request: Request) -> Response {
        if let Some(full) = self.full.get() {
            let mut full = full.clone();
            // A Router is always ready and never fails.
            return match tower::Service::call(&mut full, request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
        }
        match request.uri().path() {
            "/healthz" => "ok\n".into_response(),
            "/readyz" => self.ready.readiness().into_response(),
            "/metrics" => {
                self.ready.metrics.observe_store_reachable(false);
                let body = self.ready.metrics.render();
                ([(axum::http::header::CONTENT_TYPE, dnsplan_common::daemon::METRICS_CONTENT_TYPE)], body).into_response()
            }
            _ => {
                let message = "the store has not answered since this authority started (etcd unreachable?); DNS is served from \
                               the state saved on disk meanwhile, and this route answers once the store does"
                    .to_string();
                let error = WireError::Unavailable { detail: message.clone() };
                (StatusCode::SERVICE_UNAVAILABLE, axum::Json(ErrorBody { error, message })).into_response()
            }
        }
    }
}
