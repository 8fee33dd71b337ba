//! The admin listener: `/healthz` (the process is alive), `/readyz` (a synced snapshot is being
//! served and the process is not draining), `/metrics` (Prometheus text) and `/routes` (what
//! `ingress check` prints, for the live snapshot).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::check;
use crate::metrics::Metrics;
use crate::publish::Published;

/// Readiness inputs besides the snapshot.
#[derive(Default)]
pub struct Health {
    listening: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    pub fn set_listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Why the process is not ready, or `None` if it is.
    fn not_ready(&self, published: &Published) -> Option<&'static str> {
        if self.draining.load(Ordering::Acquire) {
            Some("draining")
        } else if !published.has_synced() {
            Some("waiting for the first snapshot")
        } else if !self.listening.load(Ordering::Acquire) {
            Some("listeners not bound")
        } else {
            None
        }
    }
}

pub struct Admin {
    pub published: Arc<Published>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

impl Admin {
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        loop {
            let stream = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        tracing::warn!(%err, "admin accept failed");
                        continue;
                    }
                },
            };
            let admin = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(admin.answer(&req)) }
                });
                if let Err(err) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%err, "admin connection error");
                }
            });
        }
    }

    fn answer(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        }
        match req.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let reason = self.health.not_ready(&self.published);
                self.metrics.ready.set(i64::from(reason.is_none()));
                match reason {
                    None => text(StatusCode::OK, "ready\n".into()),
                    Some(why) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {why}\n"),
                    ),
                }
            }
            "/metrics" => {
                self.metrics
                    .ready
                    .set(i64::from(self.health.not_ready(&self.published).is_none()));
                self.metrics
                    .refresh_certificates(&self.published.load(), crate::clock::unix_now());
                let mut response = text(StatusCode::OK, self.metrics.encode());
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                response
            }
            "/routes" => {
                let snapshot = self.published.load_full();
                text(
                    StatusCode::OK,
                    check::render_text(&check::report(&snapshot)),
                )
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /healthz /readyz /metrics /routes\n".into(),
            ),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
