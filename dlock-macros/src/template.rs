//! Key templates: `"order:<user_id>:<voucher.id>"`, `"sku:<items*>"`.

use syn::LitStr;

/// One piece of a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text, copied as it is.
    Literal(String),
    /// A parameter (or a field path into one), formatted with `Display` and escaped.
    Value(Placeholder),
}

/// `<root.field.path>` or `<root.field.path*>` (one key per item of a collection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    pub(crate) root: String,
    pub(crate) fields: Vec<String>,
    pub(crate) collection: bool,
}

/// A parsed template.
#[derive(Clone)]
pub(crate) struct Template {
    pub(crate) lit: LitStr,
    pub(crate) segments: Vec<Segment>,
}

impl Template {
    /// The collection placeholder, if there is one.
    pub(crate) fn collection(&self) -> Option<&Placeholder> {
        self.segments.iter().find_map(|s| match s {
            Segment::Value(p) if p.collection => Some(p),
            _ => None,
        })
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

fn is_field(s: &str) -> bool {
    is_ident(s) || (!s.is_empty() && s.chars().all(|c| c.is_ascii_digit()))
}

/// Parses `lit` into segments, with errors spanned on the literal.
pub(crate) fn parse(lit: &LitStr) -> syn::Result<Template> {
    let text = lit.value();
    if text.is_empty() {
        return Err(syn::Error::new(lit.span(), "`key` must not be empty"));
    }
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut rest = text.as_str();
    while let Some(open) = rest.find(['<', '>']) {
        if rest[open..].starts_with('>') {
            return Err(syn::Error::new(
                lit.span(),
                "unmatched `>` in key template; placeholders look like `<param>`",
            ));
        }
        literal.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('>') else {
            return Err(syn::Error::new(
                lit.span(),
                "unclosed `<` in key template: expected `>` after the parameter name",
            ));
        };
        let inner = after[..close].trim();
        if inner.contains('<') {
            return Err(syn::Error::new(
                lit.span(),
                "unclosed `<` in key template: expected `>` after the parameter name",
            ));
        }
        let (path, collection) = match inner.strip_suffix('*') {
            Some(path) => (path.trim(), true),
            None => (inner, false),
        };
        if path.is_empty() {
            return Err(syn::Error::new(
                lit.span(),
                "empty placeholder `<>` in key template; name a parameter, e.g. `<user_id>`",
            ));
        }
        let mut parts = path.split('.').map(str::trim);
        let root = parts.next().unwrap_or_default().to_owned();
        let fields: Vec<String> = parts.map(str::to_owned).collect();
        if !is_ident(&root) || !fields.iter().all(|f| is_field(f)) {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`<{inner}>` is not a placeholder: expected a parameter name or a field path \
                     such as `<user_id>` or `<order.user.id>` (add `*` for one key per item)"
                ),
            ));
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(std::mem::take(&mut literal)));
        }
        segments.push(Segment::Value(Placeholder {
            root,
            fields,
            collection,
        }));
        rest = &after[close + 1..];
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    let collections = segments
        .iter()
        .filter(|s| matches!(s, Segment::Value(p) if p.collection))
        .count();
    if collections > 1 {
        return Err(syn::Error::new(
            lit.span(),
            "a key template may hold one collection placeholder (`<name*>`); use several `key`s \
             to lock several collections",
        ));
    }
    Ok(Template {
        lit: lit.clone(),
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> syn::Result<Template> {
        parse(&LitStr::new(s, proc_macro2::Span::call_site()))
    }

    #[test]
    fn literals_and_placeholders() {
        let t = parse_str("order:<user_id>:<voucher.id>").unwrap();
        assert_eq!(
            t.segments,
            vec![
                Segment::Literal("order:".into()),
                Segment::Value(Placeholder {
                    root: "user_id".into(),
                    fields: vec![],
                    collection: false
                }),
                Segment::Literal(":".into()),
                Segment::Value(Placeholder {
                    root: "voucher".into(),
                    fields: vec!["id".into()],
                    collection: false
                }),
            ]
        );
        let t = parse_str("sku:<self.items*>").unwrap();
        assert!(t.collection().is_some());
        assert_eq!(parse_str("plain").unwrap().segments.len(), 1);
    }

    #[test]
    fn bad_templates() {
        for bad in [
            "",
            "a<b",
            "a<>",
            "a>b",
            "<a b>",
            "<1x>",
            "<a*>:<b*>",
            "<a<b>",
        ] {
            assert!(parse_str(bad).is_err(), "{bad:?} parsed");
        }
    }
}
