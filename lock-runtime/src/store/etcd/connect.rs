//! Connecting the etcd store: endpoints checked, TLS and authentication set, and a read that
//! only a cluster with a leader answers, all within the connect timeout.

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};

use etcd_client::{Client, ConnectOptions, GetOptions};
use tokio::sync::OnceCell;

use super::super::ReleaseHub;
use super::conn::Conn;
use super::{EtcdBackend, EtcdOptions, KEEP_ALIVE, error, unsent};
use crate::{BackendError, LockError};

impl EtcdBackend {
    /// Connects and checks that the cluster answers, within the connect timeout.
    pub(crate) async fn connect(options: EtcdOptions) -> Result<Self, LockError> {
        if options.endpoints.is_empty() {
            return Err(LockError::config("etcd needs at least one endpoint"));
        }
        for endpoint in &options.endpoints {
            check_endpoint(endpoint)?;
        }
        let shown = options.endpoints.join(", ");
        let secrets: Vec<String> = options.user.iter().map(|(_, p)| p.clone()).collect();
        if options.user.is_some() && options.endpoints.iter().any(|e| !e.starts_with("https://")) {
            tracing::warn!(
                endpoints = %shown,
                "etcd_user over plain http: the password and the auth token cross the network \
                 in clear; use https:// endpoints"
            );
        }
        // HTTP/2 pings find a connection that died without a word (a half-open TCP
        // connection, a member cut off); require-leader makes a member without a leader refuse
        // (and cancel the watches on it) instead of serving or holding them.
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.command_timeout)
            .with_keep_alive(KEEP_ALIVE, options.command_timeout.max(KEEP_ALIVE))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        connect = tls(&options, connect)?;
        if let Some((user, password)) = &options.user {
            // An auth token expires (5 minutes idle by default): fetch a new one when etcd
            // says so, rather than failing every call from then on.
            connect = connect
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let opened = tokio::time::timeout(options.connect_timeout, async {
            let client = Client::connect(&options.endpoints, Some(connect)).await?;
            // A read answers only once a leader serves it: the cluster is usable. Sent again
            // when it went to a member that is down, as every call is (`Conn::send`): one
            // member down must not fail `build()`.
            let mut tries = 0;
            loop {
                let probe = client
                    .clone()
                    .get(
                        "lock-runtime:probe",
                        Some(GetOptions::new().with_count_only()),
                    )
                    .await;
                match probe {
                    Err(e) if unsent(&e) && tries < 2 * options.endpoints.len() => tries += 1,
                    Err(e) => return Err(e),
                    Ok(_) => return Ok::<_, etcd_client::Error>(client),
                }
            }
        })
        .await;
        let client = match opened {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(error(&shown, &secrets, "cannot connect to etcd", e));
            }
            Err(_) => {
                return Err(BackendError::transient(format!(
                    "cannot connect to etcd at `{shown}`: no answer within {:?}",
                    options.connect_timeout
                ))
                .into());
            }
        };
        Ok(EtcdBackend {
            conn: Arc::new(Conn {
                client,
                options,
                shown,
                secrets,
                min_lease_secs: AtomicI64::new(0),
                renewing: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
                granted: Mutex::new(HashMap::new()),
            }),
            hub: Arc::new(ReleaseHub::default()),
            subscriber: OnceCell::new(),
            written: Mutex::new(HashMap::new()),
            journal_leases: Mutex::new(HashMap::new()),
        })
    }
}

/// An endpoint is `http://host:port`, `https://host:port` or `host:port` (a trailing `/`
/// allowed); anything else is a configuration error, named without any credentials it
/// carries (etcd takes them from `etcd_user`, never from the endpoint).
fn check_endpoint(endpoint: &str) -> Result<(), LockError> {
    let shown = crate::config::redact_url(endpoint);
    let bad = |why: &str| {
        LockError::config(format!(
            "cannot use etcd endpoint `{shown}`: {why}; expected http://host:port, \
             https://host:port or host:port"
        ))
    };
    let authority = match endpoint.split_once("://") {
        Some(("http" | "https", rest)) => rest,
        Some(_) => return Err(bad("unknown scheme")),
        None => endpoint,
    };
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    if authority.contains('@') {
        return Err(bad(
            "credentials go to etcd_user(user, password), not into the endpoint",
        ));
    }
    if authority.contains(['/', '?', '#']) {
        return Err(bad("a path or query has no meaning here"));
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Err(bad("no port"));
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad("no host"));
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad("the port is not a number from 1 to 65535"));
    }
    Ok(())
}

/// TLS for `https://` endpoints (cargo feature `tls`), verified against `tls_root_cert` or
/// else the system's roots. Endpoints are all `https://` or all plain.
fn tls(options: &EtcdOptions, connect: ConnectOptions) -> Result<ConnectOptions, LockError> {
    let secure = options
        .endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if secure != 0 && secure != options.endpoints.len() {
        return Err(LockError::config(
            "etcd endpoints must be all https:// or all plain, not a mix",
        ));
    }
    if secure == 0 {
        if options.tls_root_cert.is_some() {
            return Err(LockError::config(
                "tls_root_cert_pem was given for etcd, but no endpoint is https://",
            ));
        }
        return Ok(connect);
    }
    tls_config(options, connect)
}

#[cfg(feature = "tls")]
fn tls_config(options: &EtcdOptions, connect: ConnectOptions) -> Result<ConnectOptions, LockError> {
    use etcd_client::{Certificate, TlsOptions};
    let tls = match &options.tls_root_cert {
        Some(pem) => TlsOptions::new().ca_certificate(Certificate::from_pem(pem)),
        None => TlsOptions::new().with_native_roots(),
    };
    Ok(connect.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn tls_config(_: &EtcdOptions, _: ConnectOptions) -> Result<ConnectOptions, LockError> {
    Err(LockError::config(
        "https:// etcd endpoints need the `tls` cargo feature of lock-runtime",
    ))
}
