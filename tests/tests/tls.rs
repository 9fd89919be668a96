//! `rediss://` with the `tls-rustls` feature: dlock uses the application's rustls crypto
//! provider and never installs one itself. Each test runs in a process of its own (nextest), so
//! each starts with no provider installed.

use std::time::Duration;

use dlock_core::{Locker, redis};
use dlock_tests::handover::release_to_waiter;
use dlock_tests::{RedisServer, free_port, unique_name};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::crypto::CryptoProvider;

/// A server listening with TLS on its own port (and plain text on the harness's port, which the
/// tests never use), with a throwaway CA whose certificate the clients trust.
struct TlsServer {
    _server: RedisServer,
    _dir: tempfile::TempDir,
    tls_port: u16,
    ca_pem: String,
}

fn tls_server() -> TlsServer {
    let dir = tempfile::tempdir().expect("certificate directory");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server parameters")
        .signed_by(&key, &ca)
        .expect("server certificate");
    let path = |file: &str| dir.path().join(file).to_string_lossy().into_owned();
    std::fs::write(path("server.crt"), cert.pem()).expect("write the certificate");
    std::fs::write(path("server.key"), key.serialize_pem()).expect("write the key");
    std::fs::write(path("ca.crt"), ca.pem()).expect("write the CA");
    let tls_port = free_port().to_string();
    let server = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    TlsServer {
        _server: server,
        _dir: dir,
        tls_port: tls_port.parse().expect("a port"),
        ca_pem: ca.pem(),
    }
}

impl TlsServer {
    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// A client that trusts the throwaway CA.
    fn client(&self) -> redis::Client {
        redis::Client::build_with_tls(
            self.url(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(self.ca_pem.clone().into_bytes()),
            },
        )
        .expect("a TLS client")
    }
}

#[tokio::test]
async fn without_a_provider_building_is_a_config_error_and_installs_none() {
    assert!(CryptoProvider::get_default().is_none(), "a fresh process");
    let server = tls_server();
    for built in [
        Locker::connect(&server.url()).await,
        Locker::builder().client(server.client()).build().await,
    ] {
        let err = built.expect_err("no provider: no TLS");
        assert!(err.is_config(), "{err}");
        assert!(err.to_string().contains("crypto provider"), "{err}");
    }
    assert!(
        CryptoProvider::get_default().is_none(),
        "dlock installed a provider behind the application's back"
    );
    // The application's own provider goes in afterwards without a clash.
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application installs its provider");
}

#[tokio::test]
async fn locks_over_tls_with_the_applications_provider() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application installs its provider");
    let server = tls_server();
    let locker = Locker::builder()
        .client(server.client())
        .build()
        .await
        .expect("a TLS locker");
    let other = Locker::builder()
        .client(server.client())
        .build()
        .await
        .expect("a second TLS locker");
    let name = unique_name("tls");
    let guard = locker.lock(name.as_str()).await.expect("acquired over TLS");
    release_to_waiter(guard, &other, Duration::from_millis(100))
        .await
        .expect("woken over TLS");
}

#[tokio::test]
async fn a_server_certificate_nobody_trusts_is_refused() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application installs its provider");
    let server = tls_server();
    // The URL alone trusts only the system's roots, not the throwaway CA.
    let err = Locker::builder()
        .url(server.url())
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect_err("an untrusted certificate");
    assert!(err.is_backend() || err.is_config(), "{err}");
}
