//! How the store's connections are made: TLS through rustls with the `tls` cargo feature
//! (asked for with `sslmode=require`, `verify-ca` or `verify-full`, `sslnegotiation=direct`,
//! or by giving a root certificate), plain TCP otherwise.
//!
//! The certificate is always verified, chain and host name, whatever the `sslmode`: libpq's
//! `require` never checks the name (and the chain only when a root certificate file is
//! present), which protects little against whoever can intercept the connection. `prefer` (libpq's default) connects without TLS here; asking is
//! explicit, so a server offering a certificate this machine cannot verify never turns a
//! working plain connection into a failing one.

use tokio_postgres::config::{SslMode, SslNegotiation};

#[cfg(not(feature = "tls"))]
use crate::LockError;

/// Reads a connection string; `sslmode=verify-ca` and `verify-full` (libpq's names, which
/// the driver does not know) read as `require`, which verifies as fully here. Only a whole
/// parameter is rewritten (after `?`, `&`, a space or the start; up to `&`, a space or the
/// end), never the same text inside a password or another value.
pub(super) fn parse(url: &str) -> Option<tokio_postgres::Config> {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(i) = rest.find("sslmode=verify-") {
        let starts = i == 0 || rest[..i].ends_with(['?', '&', ' ', '\t', '\n']);
        let tail = &rest[i..];
        let end = tail.find(['&', ' ', '\t', '\n']).unwrap_or(tail.len());
        let whole = starts && matches!(&tail[..end], "sslmode=verify-full" | "sslmode=verify-ca");
        out.push_str(&rest[..i]);
        out.push_str(if whole {
            "sslmode=require"
        } else {
            &tail[..end]
        });
        rest = &tail[end..];
    }
    out.push_str(rest);
    out.parse().ok()
}

/// Whether the connection string or the builder asks for TLS.
fn wanted(config: &tokio_postgres::Config, root_pem: Option<&[u8]>) -> bool {
    config.get_ssl_mode() == SslMode::Require
        || config.get_ssl_negotiation() == SslNegotiation::Direct
        || root_pem.is_some()
}

/// What a configuration that asks for TLS may not also ask for.
#[cfg(feature = "tls")]
fn check_tls(config: &tokio_postgres::Config) -> Result<(), crate::LockError> {
    if config
        .get_hosts()
        .iter()
        .any(|h| matches!(h, tokio_postgres::config::Host::Unix(_)))
    {
        return Err(crate::LockError::config(
            "TLS to PostgreSQL over a Unix socket is not supported: use a TCP host, or leave \
             TLS off for the socket (it never leaves the machine)",
        ));
    }
    if config.get_channel_binding() == tokio_postgres::config::ChannelBinding::Require {
        return Err(crate::LockError::config(
            "channel_binding=require is not supported with TLS to PostgreSQL: the server's \
             certificate and name are verified instead",
        ));
    }
    Ok(())
}

/// Without the `tls` feature, connections are plain; asking for TLS is a configuration error.
#[cfg(not(feature = "tls"))]
pub(super) type Connector = tokio_postgres::NoTls;

/// The connector for `config`, whose `sslmode` it settles.
#[cfg(not(feature = "tls"))]
pub(super) fn connector(
    config: &mut tokio_postgres::Config,
    root_pem: Option<&[u8]>,
) -> Result<Connector, LockError> {
    if wanted(config, root_pem) {
        return Err(LockError::config(
            "the PostgreSQL URL asks for TLS (sslmode=require): enable lock-runtime's `tls` \
             cargo feature",
        ));
    }
    config.ssl_mode(SslMode::Disable);
    Ok(tokio_postgres::NoTls)
}

#[cfg(feature = "tls")]
pub(super) use with_rustls::{Connector, connector};

#[cfg(feature = "tls")]
mod with_rustls {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use rustls::pki_types::ServerName;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::config::SslMode;
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

    use super::wanted;
    use crate::LockError;

    /// Makes rustls connections for tokio-postgres, one per host name.
    #[derive(Clone)]
    pub(in crate::store::postgres) struct Connector {
        config: Arc<rustls::ClientConfig>,
    }

    /// The connector for `config`, whose `sslmode` it settles: `require` when TLS is asked
    /// for (no plain fallback), `disable` otherwise.
    pub(in crate::store::postgres) fn connector(
        config: &mut tokio_postgres::Config,
        root_pem: Option<&[u8]>,
    ) -> Result<Connector, LockError> {
        let mut roots = rustls::RootCertStore::empty();
        if !wanted(config, root_pem) {
            config.ssl_mode(SslMode::Disable);
        } else {
            super::check_tls(config)?;
            config.ssl_mode(SslMode::Require);
            match root_pem {
                Some(pem) => {
                    let mut found = 0;
                    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
                        let cert = cert.map_err(|e| {
                            LockError::config(format!("tls_root_cert_pem is not PEM: {e}"))
                        })?;
                        roots.add(cert).map_err(|e| {
                            LockError::config(format!("tls_root_cert_pem is not usable: {e}"))
                        })?;
                        found += 1;
                    }
                    if found == 0 {
                        return Err(LockError::config("tls_root_cert_pem holds no certificate"));
                    }
                }
                None => {
                    let native = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(native.certs);
                    if roots.is_empty() {
                        return Err(LockError::config(
                            "TLS to PostgreSQL: no root certificates found on this machine \
                             (install ca-certificates, or give one with tls_root_cert_pem)",
                        ));
                    }
                }
            }
        }
        // The provider named, not the process default: an application that also links
        // another provider would otherwise make rustls refuse to choose.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| LockError::config(format!("TLS setup failed: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // PostgreSQL's protocol name: servers from 17 on require it for `sslnegotiation=direct`
        // and check it when offered; older ones ignore it.
        tls.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Connector {
            config: Arc::new(tls),
        })
    }

    impl<S> MakeTlsConnect<S> for Connector
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type TlsConnect = HostConnect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, host: &str) -> Result<HostConnect, io::Error> {
            // An IP address is checked against the certificate's IP entries, a name against
            // its DNS names.
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(HostConnect {
                config: self.config.clone(),
                name,
            })
        }
    }

    /// One connection's handshake, for one host.
    pub(in crate::store::postgres) struct HostConnect {
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    }

    type Handshake<S> = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    impl<S> TlsConnect<S> for HostConnect
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type Error = io::Error;
        type Future = Handshake<S>;

        fn connect(self, stream: S) -> Handshake<S> {
            Box::pin(async move {
                let tls = tokio_rustls::TlsConnector::from(self.config)
                    .connect(self.name, stream)
                    .await?;
                Ok(Stream(tls))
            })
        }
    }

    /// An encrypted connection.
    pub(in crate::store::postgres) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

    impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
        fn channel_binding(&self) -> ChannelBinding {
            // SCRAM without channel binding: the certificate check above is what binds the
            // session to the server.
            ChannelBinding::none()
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }
}

/// Where and how to connect: the parsed configuration and its connector.
#[derive(Clone)]
pub(super) struct Endpoint {
    config: tokio_postgres::Config,
    tls: Connector,
}

/// The stream of a connection made by [`Endpoint::connect`].
pub(super) type ConnStream =
    <Connector as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream;

impl Endpoint {
    pub(super) fn new(config: tokio_postgres::Config, tls: Connector) -> Self {
        Endpoint { config, tls }
    }

    /// Opens a connection; its driver is the caller's to run.
    // Without the `tls` feature the connector is `NoTls`, which is `Copy`; rustls' is not.
    #[allow(clippy::clone_on_copy)]
    pub(super) async fn connect(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<tokio_postgres::Socket, ConnStream>,
        ),
        tokio_postgres::Error,
    > {
        self.config.connect(self.tls.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_ssl_modes_are_read() {
        for (url, mode) in [
            ("postgres://u@h/db", SslMode::Prefer),
            ("postgres://u@h/db?sslmode=disable", SslMode::Disable),
            ("postgres://u@h/db?sslmode=require", SslMode::Require),
            ("postgres://u@h/db?sslmode=verify-ca", SslMode::Require),
            ("postgres://u@h/db?sslmode=verify-full", SslMode::Require),
            ("host=h user=u sslmode=verify-full", SslMode::Require),
        ] {
            let config = parse(url).expect(url);
            assert_eq!(config.get_ssl_mode(), mode, "{url}");
        }
        assert!(parse("postgres://u@h/db?sslmode=sometimes").is_none());
        // Only whole parameters are rewritten: a password that spells one stays as it is.
        let config = parse("postgres://u:xsslmode=verify-full@h/db").expect("parses");
        assert_eq!(config.get_password(), Some(&b"xsslmode=verify-full"[..]));
        assert_eq!(config.get_ssl_mode(), SslMode::Prefer);
        let config = parse("postgres://u@h/db?application_name=sslmode=verify-ca").expect("parses");
        assert_eq!(config.get_ssl_mode(), SslMode::Prefer);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_refuses_what_it_cannot_honour() {
        for (url, says) in [
            ("host=/run/postgresql user=u sslmode=require", "Unix socket"),
            (
                "postgres://u@h/db?sslmode=require&channel_binding=require",
                "channel_binding",
            ),
        ] {
            let mut config = parse(url).expect(url);
            let err = connector(&mut config, Some(b"not used".as_slice()))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn tls_is_used_only_when_asked_for() {
        let mut config = parse("postgres://u@h/db").expect("parses");
        assert!(connector(&mut config, None).is_ok());
        assert_eq!(
            config.get_ssl_mode(),
            SslMode::Disable,
            "prefer reads as disable"
        );

        let mut config = parse("postgres://u@h/db?sslmode=require").expect("parses");
        let asked = connector(&mut config, None);
        if cfg!(feature = "tls") {
            // Verified against the system's roots, or refused for want of any.
            match asked {
                Ok(_) => assert_eq!(config.get_ssl_mode(), SslMode::Require),
                Err(e) => assert!(e.to_string().contains("no root certificates"), "{e}"),
            }
        } else {
            let err = asked.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("`tls` cargo feature"), "{err}");
        }
    }
}
