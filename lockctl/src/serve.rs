//! `lockctl serve`: the operator's web page. The jobs with a journal, the locks held now, and
//! each job's runs with their timeline, read through the same runtime API as the other
//! commands. Read-only unless started with `--allow-force-release`; then a lock can be forced
//! free from the page, after a confirmation that names its key. It listens on loopback
//! unless `--public` says otherwise (the page has no login), and it shows the store's
//! address without its password.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use lock_runtime::LockRuntime;
use serde::Deserialize;

use crate::page::{self, esc, segment};

/// How `serve` was asked to run.
#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) listen: SocketAddr,
    pub(crate) public: bool,
    pub(crate) allow_force_release: bool,
    /// The store, as the header shows it (no password).
    pub(crate) store: String,
}

struct App {
    runtime: LockRuntime,
    store: String,
    releasing: bool,
}

/// The runs a job page shows at most.
const RUNS_SHOWN: usize = 200;

/// Where the page may listen: a loopback address, or any with `--public`.
pub(crate) fn check_listen(options: &Options) -> anyhow::Result<()> {
    if !options.listen.ip().is_loopback() && !options.public {
        anyhow::bail!(
            "refusing to listen on {}: it is not a loopback address, and the page has no login; \
             add --public to serve it to other machines",
            options.listen
        );
    }
    Ok(())
}

/// Serves the page until Ctrl-C. The first line on stdout says where it listens.
pub(crate) async fn serve(runtime: &LockRuntime, options: Options) -> anyhow::Result<()> {
    check_listen(&options)?;
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| anyhow::anyhow!("listening on {}: {e}", options.listen))?;
    let at = listener.local_addr()?;
    let app = Arc::new(App {
        runtime: runtime.clone(),
        store: options.store,
        releasing: options.allow_force_release,
    });
    let router = Router::new()
        .route("/", get(home))
        .route("/jobs/{job}", get(job_page))
        .route("/locks/{key}/release", get(confirm_release).post(release))
        .fallback(not_found)
        .with_state(app);
    crate::ops::emit(&format!(
        "lockctl: serving http://{at}/ ({}); Ctrl-C stops\n",
        if options.allow_force_release {
            "force release allowed, with a confirmation"
        } else {
            "read-only"
        }
    ))?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

type Shared = State<Arc<App>>;

impl App {
    fn page(&self, status: StatusCode, title: &str, body: &str) -> Response {
        (
            status,
            Html(page::layout(
                title,
                &self.store,
                self.runtime.namespace(),
                body,
            )),
        )
            .into_response()
    }

    /// A store error as a page: the store could not answer.
    fn failed(&self, what: &str, e: &lock_runtime::LockError) -> Response {
        self.page(
            StatusCode::BAD_GATEWAY,
            "store error",
            &format!(
                "<h1>The store did not answer</h1><p>{}: {}</p>",
                esc(what),
                esc(&crate::redact::text(&e.to_string()))
            ),
        )
    }
}

async fn home(State(app): Shared) -> Response {
    let rows = match crate::history::job_rows(&app.runtime).await {
        Ok(rows) => rows,
        Err(lock_runtime::LockError::Unsupported(why)) => {
            return app.page(
                StatusCode::OK,
                "jobs",
                &format!(
                    "<h1>Scheduled jobs</h1><p class=\"note\">This store keeps no run \
                     history: {}</p>",
                    esc(&why)
                ),
            );
        }
        Err(e) => return app.failed("reading the journals", &e),
    };
    let locks = match app.runtime.list("*").await {
        Ok(locks) => locks,
        Err(e) => return app.failed("listing the locks", &e),
    };
    let body = format!(
        "<h1>Scheduled jobs</h1>{}<h2>Locks held now</h2>{}",
        page::jobs_table(&rows),
        page::locks_table(&locks, app.releasing)
    );
    app.page(StatusCode::OK, "jobs", &body)
}

#[derive(Deserialize)]
struct JobQuery {
    limit: Option<usize>,
}

async fn job_page(
    State(app): Shared,
    Path(job): Path<String>,
    Query(q): Query<JobQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(RUNS_SHOWN).clamp(1, 10_000);
    let runs = match app.runtime.history(&job, limit).await {
        Ok(runs) => runs,
        Err(e) => return app.failed(&format!("reading the journal of `{job}`"), &e),
    };
    if runs.is_empty() {
        return app.page(
            StatusCode::NOT_FOUND,
            &job,
            &format!(
                "<h1>{}</h1><p class=\"note\" id=\"no-runs\">No runs of this job in its \
                 journal.</p>",
                esc(&job)
            ),
        );
    }
    let instances: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.owner()).collect();
    let body = format!(
        "<h1 id=\"job\">{job}</h1><p class=\"note\">The newest {n} runs, from {i} instances. \
         <a href=\"/jobs/{link}?limit={more}\">more</a></p>{svg}{legend}{table}",
        job = esc(&job),
        n = runs.len(),
        i = instances.len(),
        link = esc(&segment(&job)),
        more = limit.saturating_mul(2).min(10_000),
        svg = page::timeline(&runs),
        legend = page::legend(),
        table = page::runs_table(&runs),
    );
    app.page(StatusCode::OK, &job, &body)
}

#[derive(Deserialize)]
struct ReleaseQuery {
    /// The holding the link was drawn for (its `LockInfo::holder` id); the current one when
    /// absent.
    holder: Option<String>,
}

fn refused(app: &App) -> Response {
    app.page(
        StatusCode::FORBIDDEN,
        "read-only",
        "<h1>Read-only</h1><p id=\"read-only\">This page was started without \
         <code>--allow-force-release</code>: it cannot release locks. <code>lockctl release \
         KEY --force</code> can.</p>",
    )
}

async fn confirm_release(
    State(app): Shared,
    Path(key): Path<String>,
    Query(q): Query<ReleaseQuery>,
) -> Response {
    if !app.releasing {
        return refused(&app);
    }
    let holder = match app.runtime.inspect(&key).await {
        Ok(Some(holder)) => holder,
        Ok(None) => {
            return app.page(
                StatusCode::NOT_FOUND,
                &key,
                &format!("<h1>{}</h1><p>It is not locked.</p>", esc(&key)),
            );
        }
        Err(e) => return app.failed(&format!("reading `{key}`"), &e),
    };
    let meant = q.holder.unwrap_or_else(|| holder.holder.clone());
    let since = if meant == holder.holder {
        ""
    } else {
        " (not the holding the link was drawn for, which is gone: releasing will do nothing)"
    };
    let body = format!(
        "<h1>Force the release of {key}?</h1><p>It is held by <b>{owner}</b> with fence \
         {held}{since}. Forcing it free lets another instance take it while this holder may \
         still be working; the holder hears of it at its next renewal. Only the holding \
         <code>{meant_text}</code> is released: one that came since is left alone.</p>\
         <form method=\"post\" action=\"/locks/{link}/release\">\
         <input type=\"hidden\" name=\"holder\" value=\"{meant_text}\">\
         <label>Type the key to confirm: <input name=\"confirm\" id=\"confirm\" \
         autocomplete=\"off\"></label> <button type=\"submit\" id=\"release\">Force release\
         </button></form><p><a href=\"/\">Back</a></p>",
        key = esc(&key),
        owner = esc(&holder.owner),
        held = crate::ops::fence_text(holder.fence),
        meant_text = esc(&meant),
        link = esc(&segment(&key)),
    );
    app.page(StatusCode::OK, &key, &body)
}

#[derive(Deserialize)]
struct ReleaseForm {
    holder: String,
    #[serde(default)]
    confirm: String,
}

async fn release(
    State(app): Shared,
    Path(key): Path<String>,
    Form(f): Form<ReleaseForm>,
) -> Response {
    if !app.releasing {
        return refused(&app);
    }
    if f.confirm != key {
        return app.page(
            StatusCode::BAD_REQUEST,
            &key,
            &format!(
                "<h1>Not released</h1><p id=\"outcome\">The confirmation did not name the key \
                 <code>{}</code>: nothing was done.</p><p><a href=\"/\">Back</a></p>",
                esc(&key)
            ),
        );
    }
    let text = match app.runtime.force_release_holder(&key, &f.holder).await {
        Ok(true) => format!(
            "Released <code>{}</code> (holding <code>{}</code>); its waiters were woken.",
            esc(&key),
            esc(&f.holder)
        ),
        Ok(false) => format!(
            "<code>{}</code> was not released: the holding <code>{}</code> is gone.",
            esc(&key),
            esc(&f.holder)
        ),
        Err(e) => return app.failed(&format!("releasing `{key}`"), &e),
    };
    app.page(
        StatusCode::OK,
        &key,
        &format!(
            "<h1>{}</h1><p id=\"outcome\">{text}</p><p><a href=\"/\">Back</a></p>",
            esc(&key)
        ),
    )
}

async fn not_found(State(app): Shared) -> Response {
    app.page(
        StatusCode::NOT_FOUND,
        "not found",
        "<h1>Not found</h1><p><a href=\"/\">The jobs</a></p>",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(listen: &str, public: bool) -> Options {
        Options {
            listen: listen.parse().expect("an address"),
            public,
            allow_force_release: false,
            store: String::new(),
        }
    }

    #[test]
    fn only_loopback_without_public() {
        assert!(check_listen(&options("127.0.0.1:0", false)).is_ok());
        assert!(check_listen(&options("[::1]:8080", false)).is_ok());
        let refused = check_listen(&options("0.0.0.0:8080", false));
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("--public")),
            "{refused:?}"
        );
        assert!(check_listen(&options("0.0.0.0:8080", true)).is_ok());
    }
}
