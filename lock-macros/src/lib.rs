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

/// Runs the body of an async fn on exactly one of the instances competing for `key`.
///
/// See the `lock_runtime` crate for the options and what a call returns when the body did
/// not run.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item2: proc_macro2::TokenStream = item.clone().into();
    let func: ItemFn = match syn::parse(item) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[distributed_lock] applies to an `async fn` (a free function or a method)",
            )
            .to_compile_error();
            return quote!(#error #item2).into();
        }
    };
    let options = match syn::parse::<attr::RawOptions>(args) {
        Ok(options) => options,
        Err(e) => return with_error(e, &func),
    };
    let config = match options.into_config() {
        Ok(config) => config,
        Err(e) => return with_error(e, &func),
    };
    match expand::expand(config, func.clone()) {
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
