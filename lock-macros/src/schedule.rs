//! The `#[scheduled]` attribute: options checked at expansion time (the cron expression by
//! croner, the zone by chrono-tz, as the runtime will read them), then the fn as written plus
//! its entry in the runtime's registry of jobs.

use std::str::FromStr;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, Lit, LitStr, ReturnType};

use crate::attr::{self, RawOption, RawOptions, set_once};
use crate::expand::crate_path;

const OPTIONS: &str =
    "cron, every, tz, catch_up, catch_up_window, name, local, retry_crashed, crate";

/// The default window of `catch_up = "last"`: a missed firing younger than this is run.
const DEFAULT_CATCH_UP_WINDOW_MS: u64 = 24 * 3_600_000;

#[derive(Default)]
struct Options {
    cron: Option<LitStr>,
    every: Option<(u64, LitStr)>,
    tz: Option<LitStr>,
    catch_up_last: Option<bool>,
    catch_up_window: Option<(u64, LitStr)>,
    name: Option<LitStr>,
    local: Option<(bool, Span)>,
    retry_crashed: Option<bool>,
    krate: Option<syn::Path>,
}

fn string_of(option: &RawOption) -> syn::Result<LitStr> {
    attr::string_of(&option.name, &option.value)
}

fn bool_of(option: &RawOption) -> syn::Result<bool> {
    match &option.value {
        Lit::Bool(b) => Ok(b.value),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{}` takes `true` or `false`", option.name),
        )),
    }
}

/// A duration longer than zero, in milliseconds, with its literal.
fn duration_of(option: &RawOption) -> syn::Result<(u64, LitStr)> {
    let millis = attr::duration_of(&option.name, &option.value)?;
    let text = string_of(option)?;
    if millis.ms == 0 {
        return Err(syn::Error::new_spanned(
            &text,
            format!("`{}` must be longer than zero", option.name),
        ));
    }
    Ok((millis.ms, text))
}

impl Options {
    fn set(&mut self, option: &RawOption) -> syn::Result<()> {
        let name = &option.name;
        match name.to_string().as_str() {
            "cron" => {
                let text = string_of(option)?;
                croner::Cron::from_str(&text.value()).map_err(|e| {
                    syn::Error::new_spanned(&text, format!("bad cron expression: {e}"))
                })?;
                set_once(&mut self.cron, name, text)
            }
            "every" => set_once(&mut self.every, name, duration_of(option)?),
            "tz" => {
                let text = string_of(option)?;
                chrono_tz::Tz::from_str(&text.value()).map_err(|_| {
                    syn::Error::new_spanned(
                        &text,
                        format!(
                            "unknown time zone `{}`: give an IANA name such as \"Europe/Berlin\" or \"UTC\"",
                            text.value()
                        ),
                    )
                })?;
                set_once(&mut self.tz, name, text)
            }
            "catch_up" => {
                let text = string_of(option)?;
                let last = match text.value().as_str() {
                    "skip" => false,
                    "last" => true,
                    other => {
                        return Err(syn::Error::new_spanned(
                            &text,
                            format!("unknown catch_up `{other}`; expected \"skip\" or \"last\""),
                        ));
                    }
                };
                set_once(&mut self.catch_up_last, name, last)
            }
            "catch_up_window" => set_once(&mut self.catch_up_window, name, duration_of(option)?),
            "name" => {
                let text = string_of(option)?;
                if text.value().trim().is_empty() {
                    return Err(syn::Error::new_spanned(&text, "`name` must not be empty"));
                }
                if text.value().contains(['{', '}']) || text.value().chars().any(char::is_control) {
                    return Err(syn::Error::new_spanned(
                        &text,
                        "`name` is part of the firings' marker keys: no braces, no control characters",
                    ));
                }
                set_once(&mut self.name, name, text)
            }
            "local" => set_once(&mut self.local, name, (bool_of(option)?, name.span())),
            "retry_crashed" => set_once(&mut self.retry_crashed, name, bool_of(option)?),
            "crate" => set_once(&mut self.krate, name, attr::crate_of(name, &option.value)?),
            other => Err(syn::Error::new_spanned(
                name,
                format!("unknown option `{other}`; valid options are: {OPTIONS}"),
            )),
        }
    }
}

/// Whether `attr` is `#[distributed_lock(..)]` (by its last path segment, so a renamed or
/// qualified path counts).
fn is_distributed_lock(attr: &syn::Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "distributed_lock")
}

pub(crate) fn expand(options: RawOptions, func: ItemFn) -> syn::Result<TokenStream> {
    let mut o = Options::default();
    for option in &options.0 {
        o.set(option)?;
    }
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            sig.fn_token,
            "#[scheduled] needs an `async fn`",
        ));
    }
    if let Some(first) = sig.inputs.first() {
        return Err(syn::Error::new_spanned(
            first,
            "#[scheduled] calls the fn on its own, with no arguments: a scheduled fn takes no parameters",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "#[scheduled] calls the fn on its own: a scheduled fn has no generic parameters",
        ));
    }
    let (cron, every_ms) = match (&o.cron, &o.every) {
        (Some(_), Some((_, every))) => {
            return Err(syn::Error::new_spanned(
                every,
                "`every` and `cron` cannot both be set: a job has one schedule",
            ));
        }
        (Some(cron), None) => (Some(cron.value()), None),
        (None, Some((ms, _))) => (None, Some(*ms)),
        (None, None) => {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing schedule: write e.g. #[scheduled(cron = \"0 0 2 * * *\")] or #[scheduled(every = \"5m\")]",
            ));
        }
    };
    if let (Some(tz), None) = (&o.tz, &o.cron) {
        return Err(syn::Error::new_spanned(
            tz,
            "`tz` applies to `cron` only: `every` firings are counted from the Unix epoch, the same in every zone",
        ));
    }
    if let (Some((_, window)), false) = (&o.catch_up_window, o.catch_up_last == Some(true)) {
        return Err(syn::Error::new_spanned(
            window,
            "`catch_up_window` only applies with catch_up = \"last\"",
        ));
    }
    let locked = func.attrs.iter().any(is_distributed_lock);
    let local = match o.local {
        Some((true, span)) if locked => {
            return Err(syn::Error::new(
                span,
                "`local = true` runs the job on every instance, without a lock; remove it, or remove #[distributed_lock]",
            ));
        }
        Some((local, _)) => local,
        None => false,
    };
    if !locked && !local {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[scheduled] fires the job on every instance: put #[distributed_lock(key = \"..\")] below it so that one instance runs each firing, or say `local = true` to run it on every instance",
        ));
    }
    if let (Some(true), false) = (o.retry_crashed, locked) {
        return Err(syn::Error::new(
            Span::call_site(),
            "`retry_crashed` applies to a job with #[distributed_lock]",
        ));
    }

    let krate = crate_path(o.krate.as_ref());
    let private = quote!(#krate::__private);
    let ident = &sig.ident;
    let name = o
        .name
        .as_ref()
        .map_or_else(|| ident.to_string(), LitStr::value);
    let tz =
        o.tz.as_ref()
            .map_or_else(|| "UTC".to_owned(), LitStr::value);
    let opt_str = |v: Option<String>| match v {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    };
    let opt_u64 = |v: Option<u64>| match v {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    };
    let cron = opt_str(cron);
    let every_ms = opt_u64(every_ms);
    let catch_up = opt_u64(match o.catch_up_last {
        Some(true) => Some(
            o.catch_up_window
                .map_or(DEFAULT_CATCH_UP_WINDOW_MS, |(ms, _)| ms),
        ),
        _ => None,
    });
    let retry_crashed = o.retry_crashed.unwrap_or(false);
    let (return_type, return_span) = match &sig.output {
        ReturnType::Default => (quote!(()), ident.span()),
        ReturnType::Type(_, ty) => (quote!(#ty), ty.span()),
    };
    let value = Ident::new("__scheduled_value", Span::mixed_site());
    let end = quote_spanned!(return_span=> #private::job_end::<#return_type>(&#value));
    // The registration goes through a macro defined and used on the spot: in a module that is
    // the same as writing it out; inside an `impl` (a method: it has no place in a static
    // registry), the definition is refused: "move it out to a module", and the macro's name
    // says the same where the registration goes missing.
    let registration = format_ident!(
        "register_scheduled_fn_{}_at_module_level",
        ident,
        span = ident.span()
    );
    Ok(quote! {
        #func

        macro_rules! #registration { () => {
        const _: () = {
            fn __scheduled_run() -> #private::JobFuture {
                ::std::boxed::Box::pin(async {
                    let #value = #ident().await;
                    #end
                })
            }

            #[#private::linkme::distributed_slice(#private::SCHEDULED)]
            #[linkme(crate = #private::linkme)]
            static __SCHEDULED: #private::ScheduledJob = #private::ScheduledJob {
                name: #name,
                cron: #cron,
                tz: #tz,
                every_ms: #every_ms,
                catch_up_within_ms: #catch_up,
                local: #local,
                retry_crashed: #retry_crashed,
                run: __scheduled_run,
            };
        };
        } }
        #registration!();
    })
}
