//! Parsing and checking the attribute's options: setters that reject duplicates, then one
//! `build` that checks combinations and yields a plain, validated configuration.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Ident, Lit, LitStr, Token};

use crate::duration::parse_millis;

const OPTIONS: &str =
    "key, ttl, min_hold, max_hold, on_contention, wait_timeout, watchdog, on_lost, once, crate";

/// One `name = value` pair as written.
pub(crate) struct RawOption {
    pub(crate) name: Ident,
    pub(crate) value: Lit,
}

impl Parse for RawOption {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = Ident::parse_any(input)?;
        input.parse::<Token![=]>().map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("expected `=` after `{name}`; options are written `name = value`"),
            )
        })?;
        let value: Lit = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("expected a literal value for `{name}`, e.g. `{name} = \"...\"`"),
            )
        })?;
        Ok(RawOption { name, value })
    }
}

/// The options as written, comma separated.
pub(crate) struct RawOptions(pub(crate) Punctuated<RawOption, Token![,]>);

impl Parse for RawOptions {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        Ok(RawOptions(Punctuated::parse_terminated(input)?))
    }
}

/// What to do when another instance holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contention {
    Skip,
    Wait,
    Error,
}

/// What to do when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

/// A duration in milliseconds, with the span of the literal it came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Millis {
    pub(crate) ms: u64,
    pub(crate) span: Span,
}

/// The validated configuration.
pub(crate) struct Config {
    pub(crate) key: LitStr,
    pub(crate) ttl: Option<Millis>,
    pub(crate) min_hold: Option<Millis>,
    pub(crate) max_hold: Option<Millis>,
    pub(crate) contention: Contention,
    pub(crate) wait_timeout: Option<Millis>,
    pub(crate) watchdog: bool,
    pub(crate) on_lost: OnLost,
    pub(crate) once: Option<Millis>,
    pub(crate) krate: Option<syn::Path>,
}

#[derive(Default)]
struct Builder {
    key: Option<LitStr>,
    ttl: Option<Millis>,
    min_hold: Option<Millis>,
    max_hold: Option<Millis>,
    contention: Option<(Contention, Span)>,
    wait_timeout: Option<Millis>,
    watchdog: Option<bool>,
    on_lost: Option<OnLost>,
    once: Option<Millis>,
    krate: Option<syn::Path>,
}

pub(crate) fn string_of(name: &Ident, value: &Lit) -> syn::Result<LitStr> {
    match value {
        Lit::Str(s) => Ok(s.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a string, e.g. `{name} = \"...\"`"),
        )),
    }
}

pub(crate) fn duration_of(name: &Ident, value: &Lit) -> syn::Result<Millis> {
    let text = string_of(name, value)?;
    let ms = parse_millis(&text.value())
        .map_err(|message| syn::Error::new_spanned(&text, format!("`{name}`: {message}")))?;
    Ok(Millis {
        ms,
        span: text.span(),
    })
}

/// The `crate = ".."` option: the runtime crate's path when it is renamed.
pub(crate) fn crate_of(name: &Ident, value: &Lit) -> syn::Result<syn::Path> {
    let text = string_of(name, value)?;
    text.parse().map_err(|_| {
        syn::Error::new_spanned(&text, "`crate` takes a path, e.g. `crate = \"my_locks\"`")
    })
}

pub(crate) fn set_once<T>(slot: &mut Option<T>, name: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new_spanned(
            name,
            format!("`{name}` set multiple times"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Builder {
    fn set(&mut self, option: &RawOption) -> syn::Result<()> {
        let name = &option.name;
        let value = &option.value;
        match name.to_string().as_str() {
            "key" => set_once(&mut self.key, name, string_of(name, value)?),
            "ttl" => {
                let ttl = duration_of(name, value)?;
                if ttl.ms == 0 {
                    return Err(syn::Error::new_spanned(
                        value,
                        "`ttl` must be longer than zero",
                    ));
                }
                set_once(&mut self.ttl, name, ttl)
            }
            "min_hold" => set_once(&mut self.min_hold, name, duration_of(name, value)?),
            "max_hold" => {
                let max = duration_of(name, value)?;
                if max.ms == 0 {
                    return Err(syn::Error::new_spanned(
                        value,
                        "`max_hold` must be longer than zero",
                    ));
                }
                set_once(&mut self.max_hold, name, max)
            }
            "wait_timeout" => set_once(&mut self.wait_timeout, name, duration_of(name, value)?),
            "once" => {
                let once = duration_of(name, value)?;
                if once.ms == 0 {
                    return Err(syn::Error::new_spanned(
                        value,
                        "`once` retention must be longer than zero",
                    ));
                }
                set_once(&mut self.once, name, once)
            }
            "on_contention" => {
                let text = string_of(name, value)?;
                let policy = match text.value().as_str() {
                    "skip" => Contention::Skip,
                    "wait" => Contention::Wait,
                    "error" => Contention::Error,
                    other => {
                        return Err(syn::Error::new_spanned(
                            &text,
                            format!(
                                "unknown on_contention `{other}`; expected one of \"skip\", \"wait\", \"error\""
                            ),
                        ));
                    }
                };
                set_once(&mut self.contention, name, (policy, text.span()))
            }
            "on_lost" => {
                let text = string_of(name, value)?;
                let policy = match text.value().as_str() {
                    "abort" => OnLost::Abort,
                    "continue" => OnLost::Continue,
                    other => {
                        return Err(syn::Error::new_spanned(
                            &text,
                            format!(
                                "unknown on_lost `{other}`; expected one of \"abort\", \"continue\""
                            ),
                        ));
                    }
                };
                set_once(&mut self.on_lost, name, policy)
            }
            "watchdog" => match value {
                Lit::Bool(b) => set_once(&mut self.watchdog, name, b.value),
                other => Err(syn::Error::new_spanned(
                    other,
                    "`watchdog` takes `true` or `false`",
                )),
            },
            "crate" => set_once(&mut self.krate, name, crate_of(name, value)?),
            other => Err(syn::Error::new_spanned(
                name,
                format!("unknown option `{other}`; valid options are: {OPTIONS}"),
            )),
        }
    }

    fn build(self) -> syn::Result<Config> {
        let Some(key) = self.key else {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: write e.g. #[distributed_lock(key = \"nightly-report\")]",
            ));
        };
        if let (Some(ttl), Some(min)) = (self.ttl, self.min_hold)
            && min.ms > ttl.ms
        {
            return Err(syn::Error::new(
                min.span,
                "`min_hold` is longer than `ttl`; the lease would expire before min_hold ends",
            ));
        }
        if let (Some(ttl), Some(max)) = (self.ttl, self.max_hold)
            && max.ms < ttl.ms
        {
            return Err(syn::Error::new(
                max.span,
                "`max_hold` is shorter than `ttl`; it must be at least the ttl",
            ));
        }
        let contention = self.contention.map_or(Contention::Skip, |(c, _)| c);
        if let Some(wait) = self.wait_timeout
            && contention != Contention::Wait
        {
            return Err(syn::Error::new(
                wait.span,
                "`wait_timeout` only applies with on_contention = \"wait\"",
            ));
        }
        Ok(Config {
            key,
            ttl: self.ttl,
            min_hold: self.min_hold,
            max_hold: self.max_hold,
            contention,
            wait_timeout: self.wait_timeout,
            watchdog: self.watchdog.unwrap_or(true),
            on_lost: self.on_lost.unwrap_or(OnLost::Abort),
            once: self.once,
            krate: self.krate,
        })
    }
}

impl RawOptions {
    /// Checks every option; the first mistake is the error.
    pub(crate) fn into_config(self) -> syn::Result<Config> {
        let mut builder = Builder::default();
        for option in &self.0 {
            builder.set(option)?;
        }
        builder.build()
    }
}
