//! `rediss://` with the `tls-rustls` feature: dlock uses the application's rustls crypto
//! provider and never installs one itself. Each test runs in a process of its own (nextest), so
//! each starts with no provider installed.

use std::time::Duration;

use dlock_core::Locker;
use dlock_tests::handover::release_to_waiter;
use dlock_tests::tls::TlsServer;
use dlock_tests::unique_name;
use rustls::crypto::CryptoProvider;

#[tokio::test]
async fn without_a_provider_building_is_a_config_error_and_installs_none() {
    assert!(CryptoProvider::get_default().is_none(), "a fresh process");
    let server = TlsServer::start();
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
    let server = TlsServer::start();
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
    let server = TlsServer::start();
    // The URL alone trusts only the system's roots, not the throwaway CA.
    let err = Locker::builder()
        .url(server.url())
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect_err("an untrusted certificate");
    assert!(err.is_backend() || err.is_config(), "{err}");
}

/// `DLOCK_TLS_CA` names the certificate authority a `rediss://` `DLOCK_URL` is trusted by; a
/// file that can't be read, or a source other than a URL, is a configuration error naming it.
#[tokio::test]
async fn dlock_tls_ca_trusts_a_private_authority() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application installs its provider");
    let server = TlsServer::start();
    let ca = server.ca_file();
    let vars = |pairs: &[(&str, String)]| {
        let pairs = pairs.to_vec();
        dlock_core::LockerConfig::from_vars(move |name| {
            (pairs.iter())
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
        .expect("readable variables")
    };
    let ca_path = ca.display().to_string();
    let locker = vars(&[
        ("DLOCK_URL", server.url()),
        ("DLOCK_TLS_CA", ca_path.clone()),
    ])
    .build()
    .await
    .expect("trusted through DLOCK_TLS_CA");
    let guard = locker
        .lock(unique_name("tls-ca").as_str())
        .await
        .expect("free");
    assert!(guard.release().await.is_released());

    let missing = vars(&[
        ("DLOCK_URL", server.url()),
        ("DLOCK_TLS_CA", "/nonexistent/ca.pem".to_owned()),
    ]);
    let err = missing.build().await.expect_err("no such file");
    assert!(
        err.is_config() && err.to_string().contains("DLOCK_TLS_CA"),
        "{err}"
    );
    let cluster = vars(&[
        ("DLOCK_CLUSTER_URLS", server.url()),
        ("DLOCK_TLS_CA", ca_path),
    ]);
    let err = cluster.build().await.expect_err("a URL only");
    assert!(
        err.is_config() && err.to_string().contains("DLOCK_TLS_CA"),
        "{err}"
    );
}
