//! placeholder
use proc_macro::TokenStream;
/// placeholder
#[proc_macro_attribute]
pub fn distributed_lock(_a: TokenStream, item: TokenStream) -> TokenStream { item }
