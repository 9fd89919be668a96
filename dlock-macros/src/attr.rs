//! The attribute's arguments.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, ExprLit, Lit, LitBool, LitStr, Path, Token};

use crate::template::{self, Template};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(at_least);
    syn::custom_keyword!(locker);
    syn::custom_keyword!(on_lost);
    syn::custom_keyword!(reentrant);
    syn::custom_keyword!(fair);
}

const ACCEPTED: &str =
    "`key`, `wait`, `lease`, `at_least`, `fair`, `locker`, `on_lost`, `reentrant`, `crate`";

/// What to do when the lock is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Signal,
}

/// An argument written as a literal, checked now, or as an expression, evaluated when the
/// function is called.
pub(crate) enum Value<T> {
    Literal(T),
    Expr(Expr),
}

/// The shortest and the longest lease the core accepts (`dlock_core`'s `MIN_LEASE`/`MAX_LEASE`).
const MIN_LEASE: Duration = Duration::from_millis(10);
const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The parsed arguments.
pub(crate) struct Args {
    pub(crate) keys: Vec<Template>,
    pub(crate) wait: Option<Value<Duration>>,
    pub(crate) lease: Option<Value<Duration>>,
    pub(crate) at_least: Option<Value<Duration>>,
    pub(crate) locker: Option<Expr>,
    pub(crate) on_lost: Option<Value<OnLost>>,
    pub(crate) reentrant: bool,
    /// A fair lock (`fair = true`).
    pub(crate) fair: bool,
    pub(crate) krate: Option<Path>,
}

/// Sets `slot` once; a second time is an error spanned on the argument's name.
fn once<T>(slot: &mut Option<T>, value: T, name: &str, span: Span) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("`{name}` specified more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut keys = Vec::new();
        let mut wait = None;
        let mut lease = None;
        let mut at_least = None;
        // Where a literal `at_least` was written, to point at it if it outlasts the lease.
        let mut at_least_span = None;
        let mut locker = None;
        let mut on_lost = None;
        let mut reentrant = None;
        let mut fair = None;
        // Where `fair = true` was written, to point at it if the key names several locks.
        let mut fair_span = None;
        let mut krate = None;
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                input.parse::<kw::key>()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                keys.push(template::parse(&lit)?);
            } else if lookahead.peek(kw::wait) {
                let span = input.parse::<kw::wait>()?.span;
                input.parse::<Token![=]>()?;
                let value = match string_or_expr(input)? {
                    Ok(lit) => Value::Literal(parse_duration(&lit)?),
                    Err(expr) => Value::Expr(expr),
                };
                once(&mut wait, value, "wait", span)?;
            } else if lookahead.peek(kw::lease) {
                let span = input.parse::<kw::lease>()?.span;
                input.parse::<Token![=]>()?;
                let value = match string_or_expr(input)? {
                    Ok(lit) => Value::Literal(parse_lease(&lit)?),
                    Err(expr) => Value::Expr(expr),
                };
                once(&mut lease, value, "lease", span)?;
            } else if lookahead.peek(kw::at_least) {
                let span = input.parse::<kw::at_least>()?.span;
                input.parse::<Token![=]>()?;
                let value = match string_or_expr(input)? {
                    Ok(lit) => {
                        at_least_span = Some(lit.span());
                        Value::Literal(parse_at_least(&lit)?)
                    }
                    Err(expr) => Value::Expr(expr),
                };
                once(&mut at_least, value, "at_least", span)?;
            } else if lookahead.peek(kw::locker) {
                let span = input.parse::<kw::locker>()?.span;
                input.parse::<Token![=]>()?;
                let expr: Expr = input.parse()?;
                once(&mut locker, expr, "locker", span)?;
            } else if lookahead.peek(kw::on_lost) {
                let span = input.parse::<kw::on_lost>()?.span;
                input.parse::<Token![=]>()?;
                let value = match string_or_expr(input)? {
                    Ok(lit) => Value::Literal(parse_on_lost(&lit)?),
                    Err(expr) => Value::Expr(expr),
                };
                once(&mut on_lost, value, "on_lost", span)?;
            } else if lookahead.peek(kw::reentrant) {
                let span = input.parse::<kw::reentrant>()?.span;
                input.parse::<Token![=]>()?;
                let lit: LitBool = input.parse()?;
                once(&mut reentrant, lit.value, "reentrant", span)?;
            } else if lookahead.peek(kw::fair) {
                let span = input.parse::<kw::fair>()?.span;
                input.parse::<Token![=]>()?;
                let lit: LitBool = input.parse()?;
                fair_span = Some(span);
                once(&mut fair, lit.value, "fair", span)?;
            } else if lookahead.peek(Token![crate]) {
                let span = input.parse::<Token![crate]>()?.span;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let path: Path = lit.parse().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        "`crate` must be a path, e.g. `\"::dlock_core\"`",
                    )
                })?;
                once(&mut krate, path, "crate", span)?;
            } else if input.peek(syn::Ident::peek_any) {
                let ident = syn::Ident::parse_any(input)?;
                return Err(syn::Error::new(
                    ident.span(),
                    format!("unknown argument `{ident}`; expected one of: {ACCEPTED}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        if keys.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key` argument, e.g. `#[distributed_lock(key = \"order:<user_id>\")]`",
            ));
        }
        let many = keys.len() > 1 || keys.iter().any(|k| k.collection().is_some());
        if let (Some(true), Some(span), true) = (fair, fair_span, many) {
            return Err(syn::Error::new(
                span,
                "`fair = true` takes one lock, and this key names several: a fair lock keeps one \
                 line of waiters per name",
            ));
        }
        if let (Some(Value::Literal(lease)), Some(Value::Literal(period)), Some(span)) =
            (&lease, &at_least, at_least_span)
            && period > lease
        {
            return Err(syn::Error::new(
                span,
                "`at_least` is longer than the fixed `lease`: a holder that crashed would free \
                 the name before the period ends",
            ));
        }
        Ok(Self {
            keys,
            wait,
            lease,
            at_least,
            locker,
            on_lost,
            reentrant: reentrant.unwrap_or(true),
            fair: fair.unwrap_or(false),
            krate,
        })
    }
}

/// A string literal (`"3s"`), or any other expression (`ORDER_WAIT`, `cfg.wait`, `5`).
fn string_or_expr(input: ParseStream<'_>) -> syn::Result<Result<LitStr, Expr>> {
    let expr: Expr = input.parse()?;
    match expr {
        Expr::Lit(ExprLit {
            attrs,
            lit: Lit::Str(lit),
        }) if attrs.is_empty() => Ok(Ok(lit)),
        other => Ok(Err(other)),
    }
}

fn parse_on_lost(lit: &LitStr) -> syn::Result<OnLost> {
    match lit.value().as_str() {
        "cancel" => Ok(OnLost::Cancel),
        "signal" => Ok(OnLost::Signal),
        other => Err(syn::Error::new(
            lit.span(),
            format!(
                "unknown `on_lost` policy `{other}`; expected `\"cancel\"` or `\"signal\"`, or an \
                 expression of type `dlock_core::OnLost`"
            ),
        )),
    }
}

/// A literal lease, held to the bounds the core enforces at run time.
fn parse_lease(lit: &LitStr) -> syn::Result<Duration> {
    let value = parse_duration(lit)?;
    if value < MIN_LEASE {
        return Err(syn::Error::new(
            lit.span(),
            "`lease` must be at least `10ms`",
        ));
    }
    if value > MAX_LEASE {
        return Err(syn::Error::new(
            lit.span(),
            "`lease` must be at most `87600h` (about ten years)",
        ));
    }
    Ok(value)
}

/// A literal `at_least` period, held to the bound the core enforces at run time.
fn parse_at_least(lit: &LitStr) -> syn::Result<Duration> {
    let value = parse_duration(lit)?;
    if value > MAX_LEASE {
        return Err(syn::Error::new(
            lit.span(),
            "`at_least` must be at most `87600h` (about ten years)",
        ));
    }
    Ok(value)
}

const DURATION_HELP: &str =
    "expected a number followed by a unit: `ms`, `s`, `m` or `h` (e.g. `250ms`, `3s`, `1m30s`)";

/// Parses `250ms`, `3s`, `1m30s`, `1h`, `0s`.
pub(crate) fn parse_duration(lit: &LitStr) -> syn::Result<Duration> {
    let text = lit.value();
    let error = || {
        syn::Error::new(
            lit.span(),
            format!("invalid duration `{text}`: {DURATION_HELP}"),
        )
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(error());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(error());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| error())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3600)),
            _ => return Err(error()),
        };
        total = total.checked_add(part).ok_or_else(error)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> syn::Result<Duration> {
        parse_duration(&LitStr::new(s, Span::call_site()))
    }

    fn args(tokens: &str) -> syn::Result<Args> {
        syn::parse_str(tokens)
    }

    #[test]
    fn literals_are_checked_now_and_expressions_kept_for_the_call() {
        let parsed = args(r#"key = "a", wait = "3s", lease = "10s", on_lost = "signal""#).unwrap();
        assert!(matches!(parsed.wait, Some(Value::Literal(d)) if d == Duration::from_secs(3)));
        assert!(matches!(parsed.lease, Some(Value::Literal(d)) if d == Duration::from_secs(10)));
        assert!(matches!(
            parsed.on_lost,
            Some(Value::Literal(OnLost::Signal))
        ));

        let parsed = args(
            r#"key = "a", wait = ORDER_WAIT, lease = cfg.lease * 2, on_lost = if x { a } else { b }"#,
        )
        .unwrap();
        assert!(matches!(parsed.wait, Some(Value::Expr(Expr::Path(_)))));
        assert!(matches!(parsed.lease, Some(Value::Expr(Expr::Binary(_)))));
        assert!(matches!(parsed.on_lost, Some(Value::Expr(Expr::If(_)))));

        let parsed = args(r#"key = "a", wait = 5"#).unwrap();
        assert!(matches!(parsed.wait, Some(Value::Expr(Expr::Lit(_)))));

        let parsed = args(r#"key = "a""#).unwrap();
        assert!(parsed.wait.is_none() && parsed.lease.is_none() && parsed.on_lost.is_none());
    }

    #[test]
    fn bad_literals_and_repeats_are_refused() {
        for bad in [
            r#"key = "a", wait = "3 s""#,
            r#"key = "a", lease = "5ms""#,
            r#"key = "a", lease = "100000h""#,
            r#"key = "a", on_lost = "ignore""#,
            r#"key = "a", wait = "1s", wait = W"#,
            r#"key = "a", on_lost = P, on_lost = "cancel""#,
            r#"key = "a", lease = "#,
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
        assert!(args(r#"key = "a", lease = "87600h""#).is_ok());
        assert!(args(r#"key = "a", lease = "10ms""#).is_ok());
    }

    #[test]
    fn durations() {
        assert_eq!(d("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(d("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(d("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(d("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(d("0s").unwrap(), Duration::ZERO);
        assert_eq!(d("1s500ms").unwrap(), Duration::from_millis(1500));
        for bad in ["", "3", "s", "3x", "1.5s", "-1s", "3 s"] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }
}
