//! Key templates: `"order:<user_id>:<voucher.id>"`, `"sku:<items*>"`.

use std::ops::Range;

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::Parser as _;
use syn::{Ident, LitStr, Member};

/// One piece of a key template.
#[derive(Clone)]
pub(crate) enum Segment {
    /// Literal text, copied as it is.
    Literal(String),
    /// A parameter (or a field path into one), formatted with `Display` and escaped.
    Value(Placeholder),
}

/// `<root.field.path>` or `<root.field.path*>` (one key per item of a collection).
#[derive(Clone)]
pub(crate) struct Placeholder {
    /// The parameter: `self` or a name the function's parameters bind.
    pub(crate) root: Ident,
    /// The fields reached through it, named or numbered.
    pub(crate) fields: Vec<Member>,
    /// Whether it stands for every item of a collection (`<name*>`).
    pub(crate) collection: bool,
    /// Where it sits in the template (and so in the literal, when the compiler can say).
    pub(crate) span: Span,
}

/// A parsed template.
#[derive(Clone)]
pub(crate) struct Template {
    pub(crate) segments: Vec<Segment>,
    /// The template as written (`order:<user_id>`): what labels the name's metrics.
    pub(crate) text: String,
}

impl Template {
    /// The collection placeholder, if there is one.
    pub(crate) fn collection(&self) -> Option<&Placeholder> {
        self.placeholders().find(|p| p.collection)
    }

    /// Every placeholder, in order.
    pub(crate) fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Value(p) => Some(p),
            Segment::Literal(_) => None,
        })
    }
}

/// The span of `range` (byte offsets into the literal's value) inside the literal, where the
/// compiler can point into a literal (nightly today); the whole literal otherwise.
fn span_of(lit: &LitStr, range: Range<usize>) -> Span {
    let token = lit.token();
    let repr = token.to_string();
    // Offsets into the value are offsets into the source only for a plain `"..."` literal without
    // escapes (no raw string, no suffix).
    let plain = repr.len() >= 2
        && repr.starts_with('"')
        && repr.ends_with('"')
        && repr[1..repr.len() - 1] == lit.value();
    if !plain {
        return lit.span();
    }
    token
        .subspan(range.start + 1..range.end + 1)
        .unwrap_or_else(|| lit.span())
}

/// `self`, or an identifier that is not a keyword (raw identifiers allowed).
fn parse_root(text: &str, span: Span) -> Option<Ident> {
    let mut ident = if text == "self" {
        Ident::parse_any.parse_str(text).ok()?
    } else {
        syn::parse_str::<Ident>(text).ok()?
    };
    ident.set_span(span);
    Some(ident)
}

/// A named (`user`, `r#type`) or numbered (`0`) field.
fn parse_member(text: &str, span: Span) -> Option<Member> {
    match syn::parse_str::<Member>(text).ok()? {
        Member::Named(mut ident) => {
            ident.set_span(span);
            Some(Member::Named(ident))
        }
        Member::Unnamed(mut index) => {
            // `0`, not `00` or `0x0`.
            if index.index.to_string() != text {
                return None;
            }
            index.span = span;
            Some(Member::Unnamed(index))
        }
    }
}

/// Literal text the core would refuse at run time is refused here: braces (reserved for the
/// Redis Cluster hash tag around every name) and control characters.
fn check_literal(lit: &LitStr, text: &str, range: Range<usize>) -> syn::Result<()> {
    let chunk = &text[range.clone()];
    for (index, ch) in chunk.char_indices() {
        let at = range.start + index;
        let message = if ch == '{' || ch == '}' {
            format!(
                "`{ch}` is reserved in lock names: dlock wraps every name in a `{{hash tag}}` of \
                 its own; use another separator such as `:`"
            )
        } else if ch.is_control() {
            format!(
                "control character {ch:?} in key template; lock names can't contain control \
                 characters"
            )
        } else {
            continue;
        };
        return Err(syn::Error::new(
            span_of(lit, at..at + ch.len_utf8()),
            message,
        ));
    }
    Ok(())
}

/// Parses `lit` into segments, with errors spanned on the offending part of the literal.
pub(crate) fn parse(lit: &LitStr) -> syn::Result<Template> {
    let text = lit.value();
    let error =
        |range: Range<usize>, message: String| syn::Error::new(span_of(lit, range), message);
    if text.trim().is_empty() {
        return Err(error(
            0..text.len(),
            "`key` must not be empty; write a template such as `\"order:<user_id>\"`".to_owned(),
        ));
    }
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut pos = 0;
    while let Some(found) = text[pos..].find(['<', '>']) {
        let open = pos + found;
        if text[open..].starts_with('>') {
            return Err(error(
                open..open + 1,
                "unmatched `>` in key template; placeholders look like `<param>`".to_owned(),
            ));
        }
        check_literal(lit, &text, pos..open)?;
        literal.push_str(&text[pos..open]);
        let close = match text[open + 1..].find(['<', '>']) {
            Some(at) if text[open + 1 + at..].starts_with('>') => open + 1 + at,
            _ => {
                return Err(error(
                    open..open + 1,
                    "unclosed `<` in key template: expected `>` after the parameter name"
                        .to_owned(),
                ));
            }
        };
        let whole = open..close + 1;
        let span = span_of(lit, whole.clone());
        let inner = text[open + 1..close].trim();
        let (path, collection) = match inner.strip_suffix('*') {
            Some(path) => (path.trim_end(), true),
            None => (inner, false),
        };
        if path.is_empty() {
            return Err(error(
                whole,
                "empty placeholder in key template; name a parameter, e.g. `<user_id>`".to_owned(),
            ));
        }
        let mut parts = path.split('.').map(str::trim);
        let root = parts.next().and_then(|root| parse_root(root, span));
        let fields: Option<Vec<Member>> = parts.map(|f| parse_member(f, span)).collect();
        let (Some(root), Some(fields)) = (root, fields) else {
            return Err(error(
                whole,
                format!(
                    "`<{inner}>` is not a placeholder: expected a parameter name or a field path \
                     such as `<user_id>` or `<order.user.id>` (add `*` for one key per item)"
                ),
            ));
        };
        if collection
            && segments
                .iter()
                .any(|s| matches!(s, Segment::Value(p) if p.collection))
        {
            return Err(error(
                whole,
                "a key template may hold one collection placeholder (`<name*>`); use several \
                 `key`s to lock several collections"
                    .to_owned(),
            ));
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(std::mem::take(&mut literal)));
        }
        segments.push(Segment::Value(Placeholder {
            root,
            fields,
            collection,
            span,
        }));
        pos = close + 1;
    }
    check_literal(lit, &text, pos..text.len())?;
    literal.push_str(&text[pos..]);
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    Ok(Template { segments, text })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> syn::Result<Template> {
        parse(&LitStr::new(s, Span::call_site()))
    }

    /// The template rendered back, placeholders as `<root.fields*>`.
    fn render(t: &Template) -> String {
        t.segments
            .iter()
            .map(|s| match s {
                Segment::Literal(text) => format!("[{text}]"),
                Segment::Value(p) => {
                    let mut out = format!("<{}", p.root);
                    for field in &p.fields {
                        match field {
                            Member::Named(ident) => out.push_str(&format!(".{ident}")),
                            Member::Unnamed(index) => out.push_str(&format!(".{}", index.index)),
                        }
                    }
                    if p.collection {
                        out.push('*');
                    }
                    out + ">"
                }
            })
            .collect()
    }

    #[test]
    fn literals_and_placeholders() {
        let t = parse_str("order:<user_id>:<voucher.id>").unwrap();
        assert_eq!(render(&t), "[order:]<user_id>[:]<voucher.id>");
        let t = parse_str("sku:<self.items*>").unwrap();
        assert_eq!(
            t.collection().map(|p| p.root.to_string()),
            Some("self".into())
        );
        assert_eq!(render(&t), "[sku:]<self.items*>");
        let t = parse_str("<pair.0>-< r#type . name >-<skus *>").unwrap();
        assert_eq!(render(&t), "<pair.0>[-]<r#type.name>[-]<skus*>");
        assert_eq!(render(&parse_str("plain").unwrap()), "[plain]");
        assert_eq!(parse_str("<a>:<b>").unwrap().placeholders().count(), 2);
    }

    #[test]
    fn bad_templates() {
        for bad in [
            "",
            "  ",
            "a<b",
            "a<>",
            "a<*>",
            "a>b",
            "<a b>",
            "<1x>",
            "<fn>",
            "<a.fn>",
            "<a.self>",
            "<a.00>",
            "<a..b>",
            "<a.>",
            "<a*>:<b*>",
            "<a<b>",
            "<a>>",
            "order:{<id>}",
            "a}",
            "tab\there",
        ] {
            assert!(parse_str(bad).is_err(), "{bad:?} parsed");
        }
    }
}
