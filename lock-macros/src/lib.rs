//! The `#[distributed_lock]` attribute. Use it through `lock_runtime::distributed_lock`; the
//! options, return-type policy and semantics are documented there and in the project README.
//!
//! The pipeline is parse (`attr.rs`) -> validate (`RawOptions::into_config`) -> expand
//! (`expand.rs`). Every mistake is a `syn::Error` spanned on the offending token, and on error
//! the function is still emitted unchanged next to the error, so one mistake gives one error
//! and the IDE keeps working.

use proc_macro::TokenStream;
use quote::quote;
use syn::ItemFn;

mod attr;
mod duration;
mod expand;
mod key;
mod schedule;

/// Runs the body of an async fn on exactly one of the instances competing for `key`.
///
/// See the `lock_runtime` crate for the options and what a call returns when the body did
/// not run.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(
        args,
        item,
        "#[distributed_lock] applies to an `async fn` (a free function or a method)",
        |options, func| expand::expand(options.into_config()?, func),
    )
}

/// Fires an async fn on a schedule, on one instance per firing (with `#[distributed_lock]`
/// below it).
///
/// See the `lock_runtime` crate for the options and `lock_runtime::Scheduler` for running the
/// jobs.
#[proc_macro_attribute]
pub fn scheduled(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(
        args,
        item,
        "#[scheduled] applies to an `async fn` without parameters",
        schedule::expand,
    )
}

/// Both attributes: parse the fn (or say what the attribute applies to) and the options,
/// then expand; any error comes with the fn as written.
fn attribute(
    args: TokenStream,
    item: TokenStream,
    applies_to: &str,
    expand: impl FnOnce(attr::RawOptions, ItemFn) -> syn::Result<proc_macro2::TokenStream>,
) -> TokenStream {
    let item2: proc_macro2::TokenStream = item.clone().into();
    let func: ItemFn = match syn::parse(item) {
        Ok(func) => func,
        Err(_) => {
            let error =
                syn::Error::new(proc_macro2::Span::call_site(), applies_to).to_compile_error();
            return quote!(#error #item2).into();
        }
    };
    let options = match syn::parse::<attr::RawOptions>(args) {
        Ok(options) => options,
        Err(e) => return with_error(e, &func),
    };
    match expand(options, func.clone()) {
        Ok(tokens) => tokens.into(),
        Err(e) => with_error(e, &func),
    }
}

/// The error plus the function as written, so no second error (e.g. "function not found")
/// follows from the first.
fn with_error(error: syn::Error, func: &ItemFn) -> TokenStream {
    let error = error.to_compile_error();
    quote!(#error #func).into()
}
