//! `/healthz` (the process is up) and `/readyz` (Redis and the database answer).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::App;
use crate::error::{Problem, problem_response};

/// How long a readiness check waits for each dependency.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Serialize)]
struct Ready {
    status: &'static str,
    redis: &'static str,
    database: &'static str,
}

#[derive(Debug, Serialize)]
struct NotReady {
    #[serde(flatten)]
    problem: Problem,
    redis: &'static str,
    database: &'static str,
}

/// 200 `{"status": "ok"}` while the process serves.
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// 200 `{"status": "ready", "redis": "up", "database": "up"}`, or 503 problem+json naming what
/// is down (`"redis": "down"`). Redis is `"unused"` with `--no-locks`.
pub(crate) async fn readyz(State(app): State<App>) -> Response {
    let redis = async {
        if !app.locks {
            return "unused";
        }
        match tokio::time::timeout(READY_TIMEOUT, app.locker.ping()).await {
            Ok(Ok(())) => "up",
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "readiness: redis is down");
                "down"
            }
            Err(_) => {
                tracing::warn!("readiness: redis did not answer in time");
                "down"
            }
        }
    };
    let database = async {
        let ping = sqlx::query("SELECT 1").execute(&app.db);
        match tokio::time::timeout(READY_TIMEOUT, ping).await {
            Ok(Ok(_)) => "up",
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "readiness: the database is down");
                "down"
            }
            Err(_) => {
                tracing::warn!("readiness: the database did not answer in time");
                "down"
            }
        }
    };
    let (redis, database) = tokio::join!(redis, database);
    if redis != "down" && database != "down" {
        return Json(Ready {
            status: "ready",
            redis,
            database,
        })
        .into_response();
    }
    let down: Vec<&str> = [("redis", redis), ("the database", database)]
        .into_iter()
        .filter(|(_, state)| *state == "down")
        .map(|(name, _)| name)
        .collect();
    let detail = format!(
        "not ready: {} {} down",
        down.join(" and "),
        if down.len() > 1 { "are" } else { "is" }
    );
    problem_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &NotReady {
            problem: Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail),
            redis,
            database,
        },
    )
}
