//! Code generation: the function keeps its signature; its body runs inside the runtime's
//! acquire -> watchdog -> release through `<crate>::__private`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType};

use crate::attr::{Config, Contention, Millis, OnLost};
use crate::key::{Piece, parse_template};

/// The runtime crate's path: `crate = "..."` or `::lock_runtime`.
pub(crate) fn crate_path(krate: Option<&syn::Path>) -> TokenStream {
    match krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::lock_runtime),
    }
}

pub(crate) fn expand(config: Config, func: ItemFn) -> syn::Result<TokenStream> {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            sig.fn_token,
            "#[distributed_lock] needs an `async fn`: the lock is taken and renewed asynchronously",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        return Err(syn::Error::new_spanned(
            variadic,
            "#[distributed_lock] does not support variadic functions",
        ));
    }

    let params = parameter_names(&sig);
    let key_lit = &config.key;
    let pieces = parse_template(&key_lit.value(), &params)
        .map_err(|message| syn::Error::new_spanned(key_lit, message))?;
    let krate = crate_path(config.krate.as_ref());
    let private = quote!(#krate::__private);

    // The key: format_args! with each placeholder wrapped so a non-Display value gets a plain
    // error pointing at the key.
    let mut format = String::new();
    let mut args = Vec::new();
    for piece in &pieces {
        match piece {
            Piece::Text(text) => format.push_str(text),
            Piece::Placeholder(path) => {
                format.push_str("{}");
                let span = key_lit.span();
                let segments = path.iter().map(|segment| Ident::new(segment, span));
                args.push(quote_spanned!(span=> #private::key_part(&#(#segments).*)));
            }
        }
    }
    let key_var = Ident::new("__distributed_lock_key", Span::mixed_site());

    let return_type = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => ty.to_token_stream(),
    };
    let return_span = match &sig.output {
        ReturnType::Default => sig.ident.span(),
        ReturnType::Type(_, ty) => ty.span(),
    };
    let skippable = config.contention == Contention::Skip || config.once.is_some();
    let policy_fn = if skippable {
        quote!(skip_policy)
    } else {
        quote!(error_policy)
    };
    let policy_var = Ident::new("__distributed_lock_policy", Span::mixed_site());
    // The only place the return type is checked against the policy, spanned on the type.
    let policy = quote_spanned!(return_span=>
        let #policy_var = #private::#policy_fn::<#return_type>();
    );

    let contention = match config.contention {
        Contention::Skip => quote!(Skip),
        Contention::Wait => quote!(Wait),
        Contention::Error => quote!(Error),
    };
    let opt = |m: Option<Millis>| match m {
        Some(m) => {
            let ms = m.ms;
            quote!(::core::option::Option::Some(#ms))
        }
        None => quote!(::core::option::Option::None),
    };
    let ttl = opt(config.ttl);
    let max_hold = opt(config.max_hold);
    let wait_timeout = opt(config.wait_timeout);
    let once = opt(config.once);
    let min_hold = config.min_hold.map_or(0, |m| m.ms);
    let watchdog = config.watchdog;
    let abort_on_lost = config.on_lost == OnLost::Abort;

    // A never-taken return of the declared type ties the async block's output to it, so type
    // errors in the body point at the user's code (the tracing-attributes technique).
    let fake_return = Ident::new("__distributed_lock_fake_return", Span::mixed_site());
    let body = quote_spanned! {block.span()=>
        async move {
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::needless_return, clippy::empty_loop)]
            if false {
                let #fake_return: #return_type = loop {};
                return #fake_return;
            }
            #block
        }
    };

    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #policy
            let #key_var = #private::format_key(::core::format_args!(#format, #(#args),*));
            #private::run(
                #policy_var,
                #private::LockSpec {
                    key: #key_var,
                    ttl_ms: #ttl,
                    min_hold_ms: #min_hold,
                    max_hold_ms: #max_hold,
                    contention: #private::Contention::#contention,
                    wait_timeout_ms: #wait_timeout,
                    watchdog: #watchdog,
                    abort_on_lost: #abort_on_lost,
                    once_ms: #once,
                },
                #body,
            )
            .await
        }
    })
}

/// Names a placeholder may start with: simple parameter names, and `self` for methods.
fn parameter_names(sig: &syn::Signature) -> Vec<String> {
    sig.inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some(ident.ident.to_string()),
                _ => None,
            },
        })
        .collect()
}
