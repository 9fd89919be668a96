//! `dlock` over `rediss://`: the CA named by `--tls-ca` is trusted, a certificate nobody trusts
//! is refused with a clear error, and a bad CA file is a bad argument.

use dlock_core::Locker;
use dlock_tests::tls::TlsServer;
use dlock_tests::unique_name;

mod common;
use common::{errors, run, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_list_and_release_over_tls() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the test's own provider");
    let server = TlsServer::start();
    let ca = server.ca_file();
    let ca = ca.to_str().expect("a UTF-8 path");
    let locker = Locker::builder()
        .client(server.client())
        .build()
        .await
        .expect("a TLS locker");
    let name = unique_name("tls");
    let guard = locker.lock(name.as_str()).await.expect("held");
    // Minted at the first ask: asked before `show`, so Redis has it to show.
    let token = guard.fencing_token().await.expect("a fencing token");

    let out = run(&server.url(), &["--tls-ca", ca, "show", &name]).await;
    assert!(out.status.success(), "{}", errors(&out));
    assert!(
        text(&out).contains("state            held"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("fencing token    {token}")),
        "{}",
        text(&out)
    );

    let out = run(&server.url(), &["--tls-ca", ca, "list"]).await;
    assert!(out.status.success(), "{}", errors(&out));
    assert!(text(&out).contains(&name), "{}", text(&out));

    let out = run(
        &server.url(),
        &["--tls-ca", ca, "release", &name, "--force"],
    )
    .await;
    assert!(out.status.success(), "{}", errors(&out));
    guard.lost().await;

    // Without the CA the server's certificate is trusted by nobody.
    let out = run(&server.url(), &["show", &name]).await;
    assert_eq!(out.status.code(), Some(1), "{}", errors(&out));
    assert!(
        errors(&out).starts_with("dlock: cannot reach"),
        "{}",
        errors(&out)
    );

    // A CA file that is missing, or not a certificate.
    let out = run(
        &server.url(),
        &["--tls-ca", "/nonexistent/ca.pem", "show", &name],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", errors(&out));
    assert!(
        errors(&out).contains("cannot read --tls-ca"),
        "{}",
        errors(&out)
    );
    let garbage = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(garbage.path(), "not a certificate").expect("write");
    let garbage = garbage.path().to_str().expect("a UTF-8 path").to_owned();
    let out = run(&server.url(), &["--tls-ca", &garbage, "show", &name]).await;
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(errors(&out).starts_with("dlock: "), "{}", errors(&out));
}
