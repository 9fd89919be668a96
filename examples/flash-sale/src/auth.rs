//! Who may do what: shoppers, by their session, and the operator.
//!
//! **Shoppers.** `POST /api/login` `{"name"}` signs in (the demo's one-click login by name) and
//! sets the cookie [`SESSION_COOKIE`]: a random 256-bit token, `HttpOnly` (the page's scripts
//! never see it), `SameSite=Strict` (no other site's page sends it), for [`SESSION_SECONDS`].
//! The database keeps the token's SHA-256 digest, the user and the expiry, so every instance
//! knows the session and the table alone opens none. Every shopper's route takes the user from
//! the session ([`Shopper`]), never from the path or the body: there is no way to name another
//! user's cart, orders or event stream. `POST /api/logout` deletes the session's row (on every
//! instance at once) and the cookie, and ends the session's open event streams within a few
//! seconds. Without a valid session a shopper's route answers 401.
//!
//! **Cross-site requests.** Besides `SameSite`, every request that changes something (`POST`,
//! `PUT`, `PATCH`, `DELETE`) from a browser must come from the shop's own pages
//! ([`same_origin_only`]): a browser says where a request comes from in `Sec-Fetch-Site`, or
//! else in `Origin`, and one from another site is refused with 403. A request with neither is
//! not a browser's (a script, the load generator) and carries no cookie a browser would add.
//!
//! **The operator.** Changing the catalogue (`POST /api/vouchers`, `POST /api/skus`), the
//! operator's page (`/operator`) and the shop's numbers (`/api/stats`, `/api/stats/series`) are
//! the operator's. The operator proves it with a token the instance reads from
//! [`OPERATOR_TOKEN_ENV`] at start (at least [`MIN_OPERATOR_TOKEN`] characters; every instance
//! of one shop gets the same), presented as
//!
//! - `Authorization: Bearer <token>`, for scripts and the load generator, or
//! - the cookie [`OPERATOR_COOKIE`], for a browser: `/operator/login` asks for the token once
//!   and `POST /api/operator/login` sets the cookie (`HttpOnly`, so the page's scripts never
//!   see it; `SameSite=Strict`, so no other site's page sends it; 12 hours). The cookie holds
//!   a digest of the token, not the token: a copied cookie opens the operator's pages until the
//!   token is changed, but doesn't tell the token. `POST /api/operator/logout` removes it.
//!
//! Both are compared with the instance's own in constant time (digests of equal length, compared
//! with `subtle`), so how long a refusal takes tells nothing about the token. Without a valid
//! credential the answer is 401 problem+json (403 to a signed-in shopper); an instance started
//! without a token refuses every operator request with 401 and says why. The token is never logged, never in a `Debug`
//! and never in an answer.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest as _, Sha256};
use sqlx::Row as _;
use subtle::ConstantTimeEq as _;

use crate::extract::Input;
use crate::model::{Login, User};
use crate::{App, AppError, now_ms};

/// The environment variable with the operator's token.
pub const OPERATOR_TOKEN_ENV: &str = "SHOP_OPERATOR_TOKEN";

/// The shortest token an instance accepts: 16 characters.
pub const MIN_OPERATOR_TOKEN: usize = 16;

/// The operator's cookie in a browser.
pub const OPERATOR_COOKIE: &str = "shop_operator";

/// How long the operator's cookie lasts: 12 hours.
pub const OPERATOR_COOKIE_SECONDS: u64 = 12 * 60 * 60;

/// The operator's token. Its `Debug` doesn't show it.
#[derive(Clone)]
pub struct OperatorToken(String);

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorToken(..)")
    }
}

impl OperatorToken {
    /// `token`, if it is long enough and printable ASCII (it travels in a header and a form).
    pub fn new(token: impl Into<String>) -> Result<Self, String> {
        let token = token.into();
        if token.len() < MIN_OPERATOR_TOKEN {
            return Err(format!(
                "{OPERATOR_TOKEN_ENV} must be at least {MIN_OPERATOR_TOKEN} characters"
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{OPERATOR_TOKEN_ENV} must be printable ASCII without spaces"
            ));
        }
        Ok(Self(token))
    }

    /// A new random token (32 hex digits, 128 bits), as the demo makes one.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            // No randomness from the system: two of the shop's random ids instead.
            let text = format!(
                "{}{}",
                crate::counters::random_id(),
                crate::counters::random_id()
            );
            return Self(text);
        }
        Self(hex(&bytes))
    }

    /// From [`OPERATOR_TOKEN_ENV`]: `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(OPERATOR_TOKEN_ENV) {
            Ok(token) if !token.trim().is_empty() => Self::new(token).map(Some),
            _ => Ok(None),
        }
    }

    /// The token itself: to hand to a client, never to a log.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the operator's cookie holds: a digest of the token.
    fn cookie_value(&self) -> String {
        hex(&digest(&["flash-sale operator cookie", &self.0]))
    }

    /// Whether `presented` is the token, in constant time.
    fn is(&self, presented: &str) -> bool {
        same(&digest(&[presented]), &digest(&[&self.0]))
    }

    /// Whether `presented` is what the operator's cookie holds, in constant time.
    fn is_cookie(&self, presented: &str) -> bool {
        same(
            &digest(&[presented]),
            &digest(&[self.cookie_value().as_str()]),
        )
    }
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.finalize().into()
}

fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(a.ct_eq(b))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of the cookie `name` in `headers`, if the request carries it.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// A `Set-Cookie` value: `name=value` for `max_age` seconds (0: remove it), for the whole
/// site, out of scripts' reach, never sent by another site's page; `Secure` (sent over HTTPS
/// only) when the request came over HTTPS through a proxy that says so
/// (`X-Forwarded-Proto: https`). The demo serves plain HTTP on loopback, where a `Secure`
/// cookie would not be kept.
pub(crate) fn set_cookie(
    request: &HeaderMap,
    name: &str,
    value: &str,
    max_age: u64,
) -> HeaderValue {
    let https = request
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"));
    let secure = if https { "; Secure" } else { "" };
    let text =
        format!("{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A shopper's session cookie.
pub const SESSION_COOKIE: &str = "shop_session";

/// How long a session lasts: 12 hours.
pub const SESSION_SECONDS: u64 = 12 * 60 * 60;

/// The digest the database keeps of a session token.
fn session_digest(token: &str) -> String {
    hex(&digest(&["flash-sale session", token]))
}

/// The signed-in shopper of the request, from its session cookie: 401 without a valid one.
#[derive(Debug, Clone, Copy)]
pub struct Shopper(pub i64);

/// The shopper whose session the request carries, if any (expired and unknown: none).
pub(crate) async fn session_user(app: &App, headers: &HeaderMap) -> Result<Option<i64>, AppError> {
    let Some(token) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    if token.is_empty() || token.len() > 128 {
        return Ok(None);
    }
    let row =
        sqlx::query("SELECT user_id FROM sessions WHERE token_digest = $1 AND expires_at_ms > $2")
            .bind(session_digest(token))
            .bind(now_ms())
            .fetch_optional(&app.db)
            .await?;
    Ok(match row {
        Some(row) => Some(row.try_get::<i64, _>("user_id")?),
        None => None,
    })
}

impl FromRequestParts<App> for Shopper {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, AppError> {
        if let Some(Shopper(user)) = parts.extensions.get::<Shopper>() {
            return Ok(Shopper(*user));
        }
        match session_user(app, &parts.headers).await? {
            Some(user) => {
                parts.extensions.insert(Shopper(user));
                Ok(Shopper(user))
            }
            None => Err(unauthorized(
                "sign in first: this is a signed-in shopper's (POST /api/login)",
            )),
        }
    }
}

/// How often an open event stream looks whether its session still stands.
pub(crate) const STREAM_SESSION_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Resolves when the session of `headers` has ended (signed out, or expired): an event stream
/// of a shopper ends with it. Never resolves for a request without a session, and a database
/// that can't be asked ends nothing.
pub(crate) fn session_ends(app: App, headers: &HeaderMap) -> impl Future<Output = ()> + use<> {
    let digest = cookie(headers, SESSION_COOKIE).map(session_digest);
    async move {
        let Some(digest) = digest else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(STREAM_SESSION_CHECK).await;
            let row = sqlx::query(
                "SELECT user_id FROM sessions WHERE token_digest = $1 AND expires_at_ms > $2",
            )
            .bind(&digest)
            .bind(now_ms())
            .fetch_optional(&app.db)
            .await;
            if matches!(row, Ok(None)) {
                return;
            }
        }
    }
}

/// `POST /api/login` `{"name"}`: 200 the user and a new session's cookie. A session the
/// browser had before ends: a sign-in never keeps a token that was set before it.
pub(crate) async fn login(
    State(app): State<App>,
    headers: HeaderMap,
    Input(login): Input<Login>,
) -> Result<Response, AppError> {
    let user: User = app.login(&login.name).await?;
    if let Some(old) = cookie(&headers, SESSION_COOKIE) {
        sqlx::query("DELETE FROM sessions WHERE token_digest = $1")
            .bind(session_digest(old))
            .execute(&app.db)
            .await?;
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| AppError::Internal(format!("no randomness for a session token: {e}")))?;
    let token = hex(&bytes);
    let now = now_ms();
    let seconds = i64::try_from(SESSION_SECONDS).unwrap_or(i64::MAX);
    // Expired sessions go as new ones come: the table holds about a day of logins.
    sqlx::query("DELETE FROM sessions WHERE expires_at_ms <= $1")
        .bind(now)
        .execute(&app.db)
        .await?;
    sqlx::query("INSERT INTO sessions (token_digest, user_id, expires_at_ms) VALUES ($1, $2, $3)")
        .bind(session_digest(&token))
        .bind(user.id)
        .bind(now + seconds * 1_000)
        .execute(&app.db)
        .await?;
    let cookie = set_cookie(&headers, SESSION_COOKIE, &token, SESSION_SECONDS);
    Ok(([(header::SET_COOKIE, cookie)], axum::Json(user)).into_response())
}

/// `POST /api/logout`: 204; the session is ended on every instance and its cookie removed.
pub(crate) async fn logout(
    State(app): State<App>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    if let Some(token) = cookie(&headers, SESSION_COOKIE) {
        sqlx::query("DELETE FROM sessions WHERE token_digest = $1")
            .bind(session_digest(token))
            .execute(&app.db)
            .await?;
    }
    let cookie = set_cookie(&headers, SESSION_COOKIE, "", 0);
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
}

/// `GET /api/me`: the signed-in shopper, or 401.
pub(crate) async fn me(
    State(app): State<App>,
    Shopper(user): Shopper,
) -> Result<Response, AppError> {
    Ok(axum::Json(app.user(user).await?).into_response())
}

/// Refuses (403) a request that changes something when a browser says it comes from another
/// site: `Sec-Fetch-Site` other than `same-origin` or `none` (typed in the address bar), or,
/// from a browser that doesn't send that, an `Origin` other than the shop's own. A request with
/// neither is not a browser's and passes.
pub async fn same_origin_only(request: Request, next: Next) -> Response {
    let changes = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if changes && cross_site(request.headers()) {
        tracing::warn!("cross-site request refused");
        return AppError::Rejected(
            StatusCode::FORBIDDEN,
            "this request came from another site's page; the shop takes changes only from its \
             own pages"
                .to_owned(),
        )
        .into_response();
    }
    next.run(request).await
}

fn cross_site(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    let Some(origin) = text("origin") else {
        return false;
    };
    let Some(host) = text("host") else {
        return true;
    };
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    origin_host != Some(host)
}

/// The request is the operator's: a route that takes it answers 401 without a valid
/// credential (403 to a signed-in shopper).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operator;

fn unauthorized(detail: &str) -> AppError {
    AppError::Rejected(StatusCode::UNAUTHORIZED, detail.to_owned())
}

impl FromRequestParts<App> for Operator {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, AppError> {
        let Some(token) = &app.operator else {
            return Err(unauthorized(
                "operator access is off on this instance: it was started without \
                 SHOP_OPERATOR_TOKEN",
            ));
        };
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if let Some(presented) = bearer {
            return if token.is(presented.trim()) {
                Ok(Operator)
            } else {
                Err(unauthorized("the operator token is not right"))
            };
        }
        match cookie(&parts.headers, OPERATOR_COOKIE) {
            Some(presented) if token.is_cookie(presented) => Ok(Operator),
            Some(_) => Err(unauthorized(
                "the operator sign-in has expired or the token changed: sign in again at \
                 /operator/login",
            )),
            None if session_user(app, &parts.headers).await?.is_some() => Err(AppError::Rejected(
                StatusCode::FORBIDDEN,
                "this is the operator's; a shopper's sign-in is not enough".to_owned(),
            )),
            None => Err(unauthorized(
                "this is the operator's: send Authorization: Bearer <operator token>, or sign \
                 in at /operator/login",
            )),
        }
    }
}

/// `POST /api/operator/login`.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct OperatorLogin {
    token: String,
}

/// `POST /api/operator/login` `{"token"}`: 204 and the operator's cookie, or 401.
pub(crate) async fn operator_login(
    State(app): State<App>,
    headers: HeaderMap,
    Input(login): Input<OperatorLogin>,
) -> Result<Response, AppError> {
    let Some(token) = &app.operator else {
        return Err(unauthorized(
            "operator access is off on this instance: it was started without \
             SHOP_OPERATOR_TOKEN",
        ));
    };
    if !token.is(login.token.trim()) {
        tracing::warn!("operator sign-in refused: wrong token");
        return Err(unauthorized("the operator token is not right"));
    }
    tracing::info!("operator signed in");
    let cookie = set_cookie(
        &headers,
        OPERATOR_COOKIE,
        &token.cookie_value(),
        OPERATOR_COOKIE_SECONDS,
    );
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
}

/// `POST /api/operator/logout`: 204, the operator's cookie removed.
pub(crate) async fn operator_logout(headers: HeaderMap) -> Response {
    let cookie = set_cookie(&headers, OPERATOR_COOKIE, "", 0);
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response()
}

/// Whether the request is a browser's navigation to a page (it accepts HTML).
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

/// `GET /operator`: the operator's page for the operator; a browser without the credential is
/// sent to `/operator/login` (303), anything else gets the 401.
pub(crate) async fn operator_page(
    operator: Result<Operator, AppError>,
    headers: HeaderMap,
) -> Response {
    match operator {
        Ok(Operator) => axum::response::Html(crate::routes::OPERATOR_PAGE).into_response(),
        Err(_) if wants_html(&headers) => Redirect::to("/operator/login").into_response(),
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_never_shown() {
        assert!(OperatorToken::new("short").is_err());
        assert!(OperatorToken::new("has a space in it, long").is_err());
        let token = OperatorToken::new("0123456789abcdef").unwrap();
        assert_eq!(format!("{token:?}"), "OperatorToken(..)");
        assert!(token.is("0123456789abcdef"));
        assert!(!token.is("0123456789abcdeF"));
        assert!(!token.is(""));
        assert!(token.is_cookie(&token.cookie_value()));
        assert!(!token.is_cookie("0123456789abcdef"));
        assert!(!token.cookie_value().contains("0123456789abcdef"));
        let generated = OperatorToken::generate();
        assert!(OperatorToken::new(generated.expose()).is_ok());
        assert_ne!(generated.expose(), OperatorToken::generate().expose());
    }

    #[test]
    fn cookies_are_read_by_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; shop_operator=xyz"),
        );
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&headers, OPERATOR_COOKIE), Some("xyz"));
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, "shop"), None);
    }
}
