//! Code generation.

use std::collections::BTreeSet;
use std::time::Duration;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{AttrStyle, FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::attr::{Args, OnLost, Value};
use crate::template::{Placeholder, Segment, Template};

const RETURN_HELP: &str = "a `#[distributed_lock]` function must return `Result<_, E>` with \
                           `E: From<dlock_core::LockError>`";

/// Checks the function and rewrites its body.
pub(crate) fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "the `async` keyword is missing from the function declaration",
        ));
    }
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) if returns_result(ty) => ty.clone(),
        ReturnType::Type(_, ty) => {
            return Err(syn::Error::new(ty.span(), RETURN_HELP));
        }
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.paren_token.span.close(),
                format!("{RETURN_HELP}; it returns `()`"),
            ));
        }
    };

    let params = Params::of(&func);
    for template in &args.keys {
        params.check(template, &sig.ident)?;
    }

    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::dlock_core),
    };
    let support = quote!(#krate::macro_support);
    // Where a missing `From<LockError>` for the error type is reported: on the error type.
    let error_span = error_type(&ret_ty).map_or_else(|| ret_ty.span(), |ty| ty.span());
    let locker = match &args.locker {
        Some(expr) => {
            let to_locker = respan(quote!(#support::to_locker), expr.span());
            quote_spanned! {expr.span()=>
                let __dlock_locker: ::core::option::Option<#krate::Locker> =
                    ::core::option::Option::Some(#to_locker(&(#expr)));
            }
        }
        None => quote! {
            let __dlock_locker: ::core::option::Option<#krate::Locker> =
                ::core::option::Option::None;
        },
    };

    let many = args.keys.len() > 1 || args.keys.iter().any(|k| k.collection().is_some());
    let names = if many {
        let pushes = args.keys.iter().map(|key| match key.collection() {
            Some(collection) => {
                let items = value_expr(collection);
                let build = build_name(key, &support);
                let push_each = respan(quote!(#support::push_each), collection.span);
                // Method syntax, so that `&skus` iterates whether `skus` is a collection or a
                // reference to one.
                quote_spanned! {collection.span=>
                    #[allow(clippy::into_iter_on_ref)]
                    #push_each(&mut __dlock_names, (&#items).into_iter(), |__dlock_item| #build);
                }
            }
            None => {
                let build = build_name(key, &support);
                quote!(__dlock_names.push(#build);)
            }
        });
        quote! {
            #[allow(clippy::vec_init_then_push)]
            let __dlock_names = {
                let mut __dlock_names = ::std::vec::Vec::new();
                #(#pushes)*
                #support::Names::Many(__dlock_names)
            };
        }
    } else {
        let build = build_name(&args.keys[0], &support);
        quote! {
            let __dlock_names = #support::Names::One(#build);
        }
    };

    // Without `wait` or `lease`, the `Locker`'s defaults apply; without `at_least`, none. Expressions are evaluated here,
    // in the function's scope, when it is called; each is bound to a `let` of the type it must
    // have, spanned on the expression, so that a wrong type is reported on the user's expression.
    let mut evaluated = TokenStream::new();
    let wait = optional_duration(args.wait.as_ref(), quote!(__dlock_wait), &mut evaluated);
    let lease = optional_duration(args.lease.as_ref(), quote!(__dlock_lease), &mut evaluated);
    let at_least = optional_duration(
        args.at_least.as_ref(),
        quote!(__dlock_at_least),
        &mut evaluated,
    );
    let on_lost = match &args.on_lost {
        None | Some(Value::Literal(OnLost::Cancel)) => quote!(#support::OnLost::Cancel),
        Some(Value::Literal(OnLost::Signal)) => quote!(#support::OnLost::Signal),
        Some(Value::Expr(expr)) => {
            evaluated.extend(typed_let(
                quote!(__dlock_on_lost),
                &quote!(#krate::OnLost),
                expr,
            ));
            quote!(__dlock_on_lost)
        }
    };
    let reentrant = args.reentrant;
    let fair = args.fair;

    // A return edge of the declared type, never taken, so that `?` and type errors in the body
    // are checked against the function's own signature. (`impl Trait` can't be named in a
    // `let`; those bodies are inferred from `run`'s signature instead.)
    let fake_return = if contains_impl_trait(&ret_ty) {
        quote!()
    } else {
        quote! {
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::needless_return
            )]
            if false {
                let __dlock_fake_return: #ret_ty = loop {};
                return __dlock_fake_return;
            }
        }
    };

    // Any unmet bound of the call (the error type's `From<LockError>`) is reported on the
    // function's error type.
    let run_call = respan(
        quote! {
            #support::run(
                __dlock_locker,
                __dlock_names,
                #support::Options {
                    wait: #wait,
                    lease: #lease,
                    at_least: #at_least,
                    on_lost: #on_lost,
                    reentrant: #reentrant,
                    fair: #fair,
                },
                __dlock_body,
            )
            .await
        },
        error_span,
    );

    // `modifiers` (`default fn`) only exist on associated functions; an `ItemFn` never has any.
    let ItemFn {
        attrs,
        vis,
        modifiers: _,
        sig,
        block,
    } = func;
    // `#![inner]` attributes of the body stay inside the body.
    let (inner, outer): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));
    // The body's statements, not its block: a one-expression body would otherwise be a block in
    // tail position, which `unused_braces` flags.
    let stmts = &block.stmts;
    Ok(quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            #locker
            #evaluated
            #names
            let __dlock_body = async move {
                #fake_return
                #(#stmts)*
            };
            #run_call
        }
    })
}

/// `tokens` with every span set to `span`, so that an error about them points there.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut new =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                tree = TokenTree::Group(new);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .map(own_locals)
        .collect()
}

/// The macro's own local names (`__dlock_*`) resolve as the macro's, wherever they are placed:
/// a span taken from the user's tokens may come from a `macro_rules!` that wrote the function,
/// and with its hygiene the names would not find the macro's `let`s.
fn own_locals(tree: TokenTree) -> TokenTree {
    match tree {
        TokenTree::Ident(mut ident) if ident.to_string().starts_with("__dlock_") => {
            ident.set_span(Span::call_site().located_at(ident.span()));
            TokenTree::Ident(ident)
        }
        TokenTree::Group(group) => {
            let stream = group.stream().into_iter().map(own_locals).collect();
            let mut new = proc_macro2::Group::new(group.delimiter(), stream);
            new.set_span(group.span());
            TokenTree::Group(new)
        }
        other => other,
    }
}

/// `let #name: #ty = #expr;`, the type spanned on `expr`: a mismatched type is an error on the
/// expression, and "expected due to this" points there too. (The name keeps its own span, so
/// that it resolves like every other generated name.)
fn typed_let(name: TokenStream, ty: &TokenStream, expr: &syn::Expr) -> TokenStream {
    let span = expr.span();
    let ty = respan(ty.clone(), span);
    quote_spanned! {span=>
        let #name: #ty = #expr;
    }
}

/// An `Option<Duration>` for a duration argument: `None` when absent, the literal, or the
/// expression bound to `binding` (a `let` added to `evaluated`).
fn optional_duration(
    value: Option<&Value<Duration>>,
    binding: TokenStream,
    evaluated: &mut TokenStream,
) -> TokenStream {
    match value {
        None => quote!(::core::option::Option::None),
        Some(Value::Literal(d)) => {
            let d = duration(*d);
            quote!(::core::option::Option::Some(#d))
        }
        Some(Value::Expr(expr)) => {
            let ty = quote!(::core::time::Duration);
            evaluated.extend(typed_let(binding.clone(), &ty, expr));
            quote!(::core::option::Option::Some(#binding))
        }
    }
}

fn duration(d: Duration) -> TokenStream {
    let secs = proc_macro2::Literal::u64_unsuffixed(d.as_secs());
    let nanos = proc_macro2::Literal::u32_unsuffixed(d.subsec_nanos());
    quote!(::core::time::Duration::new(#secs, #nanos))
}

/// Whether the declared return type is a `Result`: any path whose last name ends in `Result`, so
/// aliases such as `io::Result<T>`, `anyhow::Result<T>` and `ApiResult<T>` count.
fn returns_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident.to_string().ends_with("Result")),
        Type::Group(group) => returns_result(&group.elem),
        Type::Paren(paren) => returns_result(&paren.elem),
        _ => false,
    }
}

/// `E` in a return type written `Result<T, E>`.
fn error_type(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Path(path) => {
            let last = path.path.segments.last()?;
            let PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            let types: Vec<&Type> = args
                .args
                .iter()
                .filter_map(|arg| match arg {
                    GenericArgument::Type(ty) => Some(ty),
                    _ => None,
                })
                .collect();
            match types.as_slice() {
                [_, error] => Some(*error),
                _ => None,
            }
        }
        Type::Group(group) => error_type(&group.elem),
        Type::Paren(paren) => error_type(&paren.elem),
        _ => None,
    }
}

fn contains_impl_trait(ty: &Type) -> bool {
    quote!(#ty).to_string().contains("impl ")
}

/// The names the function's parameters bind.
struct Params {
    names: BTreeSet<String>,
    /// Whether some parameter is a pattern (`(a, b): (u64, u64)`) rather than a name.
    destructured: bool,
}

impl Params {
    fn of(func: &ItemFn) -> Self {
        let mut params = Self {
            names: BTreeSet::new(),
            destructured: false,
        };
        for input in &func.sig.inputs {
            match input {
                FnArg::Receiver(_) => {
                    params.names.insert("self".to_owned());
                }
                FnArg::Typed(typed) => {
                    if !matches!(&*typed.pat, Pat::Ident(ident) if ident.subpat.is_none()) {
                        params.destructured = true;
                    }
                    bound_names(&typed.pat, &mut params.names);
                }
            }
        }
        params
    }

    fn check(&self, template: &Template, func: &syn::Ident) -> syn::Result<()> {
        for placeholder in template.placeholders() {
            let root = placeholder.root.to_string();
            if self.names.contains(&root) {
                continue;
            }
            let known = if self.names.is_empty() {
                "it has no parameters".to_owned()
            } else {
                let list: Vec<String> = self.names.iter().map(|p| format!("`{p}`")).collect();
                format!("the names it binds are: {}", list.join(", "))
            };
            let hint = if self.destructured {
                "; a destructured parameter has no name of its own: name one of the bindings of \
                 its pattern, or take the parameter whole and destructure it in the body"
            } else {
                ""
            };
            return Err(syn::Error::new(
                placeholder.span,
                format!("`<{root}>` names no parameter of `{func}`; {known}{hint}"),
            ));
        }
        Ok(())
    }
}

fn bound_names(pat: &Pat, names: &mut BTreeSet<String>) {
    match pat {
        Pat::Ident(ident) => {
            names.insert(ident.ident.to_string());
            if let Some((_, sub)) = &ident.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Reference(r) => bound_names(&r.pat, names),
        Pat::Tuple(t) => t.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| bound_names(&f.pat, names)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Type(t) => bound_names(&t.pat, names),
        Pat::Paren(p) => bound_names(&p.pat, names),
        _ => {}
    }
}

/// `self.items.0` as an expression, spanned on the placeholder so that a missing field or a
/// value without `Display` is reported on the key template.
fn value_expr(placeholder: &Placeholder) -> TokenStream {
    let root = &placeholder.root;
    let fields = &placeholder.fields;
    quote_spanned!(placeholder.span=> #root #(.#fields)*)
}

/// An expression building one name (`Result<LockName, LockError>`); the collection placeholder,
/// if any, is the closure parameter `__dlock_item`.
fn build_name(template: &Template, support: &TokenStream) -> TokenStream {
    let steps = template.segments.iter().map(|segment| match segment {
        Segment::Literal(text) => quote!(__dlock_name.push_literal(#text);),
        Segment::Value(placeholder) if placeholder.collection => {
            let push_value = respan(quote!(#support::push_value), placeholder.span);
            let push =
                quote_spanned!(placeholder.span=> #push_value(&mut __dlock_name, &__dlock_item););
            push.into_iter().map(own_locals).collect()
        }
        Segment::Value(placeholder) => {
            let value = value_expr(placeholder);
            let push_value = respan(quote!(#support::push_value), placeholder.span);
            let push = quote_spanned!(placeholder.span=> #push_value(&mut __dlock_name, &#value););
            push.into_iter().map(own_locals).collect()
        }
    });
    let text = &template.text;
    quote! {{
        let mut __dlock_name = #support::NameBuilder::new();
        #(#steps)*
        #support::from_template(__dlock_name.build(), #text)
    }}
}
