//! Code generation.

use std::collections::BTreeSet;
use std::time::Duration;

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{FnArg, ItemFn, Pat, ReturnType, Type};

use crate::attr::{Args, OnLost};
use crate::template::{Placeholder, Segment, Template};

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
            return Err(syn::Error::new(
                ty.span(),
                "a `#[distributed_lock]` function must return `Result<_, E>` with \
                 `E: From<dlock_core::LockError>`",
            ));
        }
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.paren_token.span.close(),
                "a `#[distributed_lock]` function must return `Result<_, E>` with \
                 `E: From<dlock_core::LockError>`; it returns `()`",
            ));
        }
    };

    let params = parameter_names(&func)?;
    for template in &args.keys {
        check_placeholders(template, &params, &sig.ident)?;
    }

    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::dlock_core),
    };
    let support = quote!(#krate::macro_support);

    let locker = match &args.locker {
        Some(expr) => quote_spanned! {expr.span()=>
            let __dlock_locker: #krate::Locker = #support::to_locker(&(#expr));
        },
        None => quote! {
            let __dlock_locker: #krate::Locker = match #support::default_locker() {
                ::core::result::Result::Ok(locker) => ::core::clone::Clone::clone(locker),
                ::core::result::Result::Err(err) => {
                    return ::core::result::Result::Err(::core::convert::From::from(err));
                }
            };
        },
    };

    let many = args.keys.len() > 1 || args.keys.iter().any(|k| k.collection().is_some());
    let names = if many {
        let pushes = args.keys.iter().map(|key| match key.collection() {
            Some(collection) => {
                let items = value_expr(collection);
                let build = build_name(key, &support, Some(quote!(__dlock_item)));
                quote! {
                    __dlock_names.extend((&#items).into_iter().map(|__dlock_item| #build));
                }
            }
            None => {
                let build = build_name(key, &support, None);
                quote!(__dlock_names.push(#build);)
            }
        });
        quote! {
            #[allow(clippy::into_iter_on_ref, clippy::vec_init_then_push)]
            let __dlock_names = {
                let mut __dlock_names = ::std::vec::Vec::new();
                #(#pushes)*
                #support::Names::Many(__dlock_names)
            };
        }
    } else {
        let build = build_name(&args.keys[0], &support, None);
        quote! {
            let __dlock_names = #support::Names::One(#build);
        }
    };

    let wait = duration(args.wait.unwrap_or(Duration::ZERO));
    let lease = match args.lease {
        Some(lease) => {
            let lease = duration(lease);
            quote!(::core::option::Option::Some(#lease))
        }
        None => quote!(::core::option::Option::None),
    };
    let on_lost = match args.on_lost {
        OnLost::Cancel => quote!(#support::OnLost::Cancel),
        OnLost::Signal => quote!(#support::OnLost::Signal),
    };
    let reentrant = args.reentrant;

    // A return edge of the declared type, never taken, so that `?` and type errors in the body
    // are checked against the function's own signature.
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

    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #locker
            #names
            let __dlock_body = async move {
                #fake_return
                #block
            };
            #support::run(
                &__dlock_locker,
                __dlock_names,
                #support::Options {
                    wait: #wait,
                    lease: #lease,
                    on_lost: #on_lost,
                    reentrant: #reentrant,
                },
                __dlock_body,
            )
            .await
        }
    })
}

fn duration(d: Duration) -> TokenStream {
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_millis(#millis))
}

/// Whether the declared return type is a `Result` (any path ending in `Result`, so aliases such
/// as `io::Result<T>` and `anyhow::Result<T>` count).
fn returns_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Result"),
        Type::Group(group) => returns_result(&group.elem),
        Type::Paren(paren) => returns_result(&paren.elem),
        _ => false,
    }
}

fn contains_impl_trait(ty: &Type) -> bool {
    quote!(#ty).to_string().contains("impl ")
}

/// Every name the parameters bind, `self` included.
fn parameter_names(func: &ItemFn) -> syn::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for input in &func.sig.inputs {
        match input {
            FnArg::Receiver(_) => {
                names.insert("self".to_owned());
            }
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
        }
    }
    Ok(names)
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

fn check_placeholders(
    template: &Template,
    params: &BTreeSet<String>,
    func: &syn::Ident,
) -> syn::Result<()> {
    for segment in &template.segments {
        let Segment::Value(placeholder) = segment else {
            continue;
        };
        if !params.contains(&placeholder.root) {
            let known = if params.is_empty() {
                "it has no parameters".to_owned()
            } else {
                let list: Vec<String> = params.iter().map(|p| format!("`{p}`")).collect();
                format!("the names it binds are: {}", list.join(", "))
            };
            return Err(syn::Error::new(
                template.lit.span(),
                format!(
                    "`<{}>` names no parameter of `{func}`; {known} (a destructured parameter \
                     is reachable only through the names its pattern binds)",
                    placeholder.root
                ),
            ));
        }
    }
    Ok(())
}

/// `self.items.0` as an expression.
fn value_expr(placeholder: &Placeholder) -> TokenStream {
    let root = if placeholder.root == "self" {
        quote!(self)
    } else {
        let ident = format_ident!("{}", placeholder.root);
        quote!(#ident)
    };
    let fields = placeholder.fields.iter().map(|f| match f.parse::<u32>() {
        Ok(index) => {
            let index = syn::Index::from(usize::try_from(index).unwrap_or(usize::MAX));
            quote!(.#index)
        }
        Err(_) => {
            let ident = format_ident!("{}", f);
            quote!(.#ident)
        }
    });
    quote!(#root #(#fields)*)
}

/// An expression building one name (`Result<LockName, LockError>`); the collection placeholder,
/// if any, is the closure parameter `item`.
fn build_name(
    template: &Template,
    support: &TokenStream,
    item: Option<TokenStream>,
) -> TokenStream {
    let steps = template.segments.iter().map(|segment| match segment {
        Segment::Literal(text) => quote!(__dlock_name.push_literal(#text);),
        Segment::Value(placeholder) if placeholder.collection => {
            let item = item.clone().unwrap_or_else(|| quote!(__dlock_item));
            quote!(__dlock_name.push_value(#item);)
        }
        Segment::Value(placeholder) => {
            let value = value_expr(placeholder);
            quote!(__dlock_name.push_value(&#value);)
        }
    });
    quote! {{
        let mut __dlock_name = #support::NameBuilder::new();
        #(#steps)*
        __dlock_name.build()
    }}
}
