//! [`TlsServer`]: a `redis-server` that speaks TLS, with a throwaway certificate authority.

use crate::{RedisServer, free_port};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A server listening with TLS on its own port (and plain text on the harness's port, which
/// TLS tests never use), with a throwaway CA that signed its certificate for `127.0.0.1` and
/// `localhost`. Clients must be told to trust the CA ([`TlsServer::ca_pem`]).
#[derive(Debug)]
pub struct TlsServer {
    _server: RedisServer,
    dir: tempfile::TempDir,
    tls_port: u16,
    ca_pem: String,
}

impl TlsServer {
    /// Generates the CA and the server's certificate and starts the server.
    pub fn start() -> Self {
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
        Self {
            _server: server,
            dir,
            tls_port: tls_port.parse().expect("a port"),
            ca_pem: ca.pem(),
        }
    }

    /// `rediss://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// The CA's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A file holding the CA's certificate, PEM.
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A client that trusts the throwaway CA.
    pub fn client(&self) -> redis::Client {
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
