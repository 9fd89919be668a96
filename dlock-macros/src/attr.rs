//! The attribute's arguments.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, LitBool, LitStr, Path, Token};

use crate::template::{self, Template};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(locker);
    syn::custom_keyword!(on_lost);
    syn::custom_keyword!(reentrant);
}

const ACCEPTED: &str = "`key`, `wait`, `lease`, `locker`, `on_lost`, `reentrant`, `crate`";

/// What to do when the lock is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Signal,
}

/// The parsed arguments.
pub(crate) struct Args {
    pub(crate) keys: Vec<Template>,
    pub(crate) wait: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) locker: Option<Expr>,
    pub(crate) on_lost: OnLost,
    pub(crate) reentrant: bool,
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
        let mut locker = None;
        let mut on_lost = None;
        let mut reentrant = None;
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
                let lit: LitStr = input.parse()?;
                once(&mut wait, parse_duration(&lit)?, "wait", span)?;
            } else if lookahead.peek(kw::lease) {
                let span = input.parse::<kw::lease>()?.span;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let value = parse_duration(&lit)?;
                if value < Duration::from_millis(10) {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`lease` must be at least `10ms`",
                    ));
                }
                once(&mut lease, value, "lease", span)?;
            } else if lookahead.peek(kw::locker) {
                let span = input.parse::<kw::locker>()?.span;
                input.parse::<Token![=]>()?;
                let expr: Expr = input.parse()?;
                once(&mut locker, expr, "locker", span)?;
            } else if lookahead.peek(kw::on_lost) {
                let span = input.parse::<kw::on_lost>()?.span;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let value = match lit.value().as_str() {
                    "cancel" => OnLost::Cancel,
                    "signal" => OnLost::Signal,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `on_lost` policy `{other}`; expected `\"cancel\"` or `\"signal\"`"
                            ),
                        ));
                    }
                };
                once(&mut on_lost, value, "on_lost", span)?;
            } else if lookahead.peek(kw::reentrant) {
                let span = input.parse::<kw::reentrant>()?.span;
                input.parse::<Token![=]>()?;
                let lit: LitBool = input.parse()?;
                once(&mut reentrant, lit.value, "reentrant", span)?;
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
        Ok(Self {
            keys,
            wait,
            lease,
            locker,
            on_lost: on_lost.unwrap_or(OnLost::Cancel),
            reentrant: reentrant.unwrap_or(true),
            krate,
        })
    }
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
