//! TLS for the control API's server: its certificate and key, and optionally the CA whose
//! client certificates it takes, made into one rustls `ServerConfig` held in an `ArcSwap`, so
//! that a reload (new certificate, new CA) applies to every connection accepted after it and
//! leaves the open ones as they are.
//!
//! rustls on ring, TLS 1.2 and 1.3, HTTP/1.1 by ALPN. Client certificates are asked for but
//! not required when a CA is given (clients with tokens come without one); one that does not
//! chain to the CA fails the handshake. What a verified certificate may do is the caller's
//! (the authority's `access`), given as [`PeerCertificate`] in each request's extensions.

use arc_swap::ArcSwap;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use tokio_rustls::rustls::ServerConfig;
pub use tokio_rustls::rustls::pki_types::ServerName;

/// The server's TLS, swapped whole by a reload.
pub type ServerTls = Arc<ArcSwap<rustls::ServerConfig>>;

/// The certificate a client presented and the CA verified, in every request of its connection.
#[derive(Clone, Debug)]
pub struct PeerCertificate(pub Arc<CertificateDer<'static>>);

/// The PEM texts of a server's TLS files.
pub struct ServerTlsPem<'a> {
    /// The certificate chain, leaf first.
    pub cert: &'a [u8],
    pub key: &'a [u8],
    /// The CA whose client certificates are taken, if any.
    pub client_ca: Option<&'a [u8]>,
}

/// A `ServerConfig` from PEM texts; the error names which file is wrong and how.
pub fn server_config(pem: &ServerTlsPem<'_>) -> Result<rustls::ServerConfig, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cert_file: not a PEM certificate chain: {e}"))?;
    if certs.is_empty() {
        return Err("cert_file: holds no certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    let key = PrivateKeyDer::from_pem_slice(pem.key).map_err(|e| format!("key_file: not a PEM private key: {e}"))?;
    // ring, as for etcd's TLS and TSIG: aws-lc-rs (rustls's choice now, for post-quantum key
    // exchange) would add a C and CMake build to every build of the workspace.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?;
    let builder = match pem.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| format!("client_ca_file: not a PEM certificate: {e}"))?;
                roots.add(cert).map_err(|e| format!("client_ca_file: not a usable CA certificate: {e}"))?;
            }
            if roots.is_empty() {
                return Err("client_ca_file: holds no certificate".into());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("client_ca_file: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder.with_single_cert(certs, key).map_err(|e| format!("cert_file and key_file: the key does not fit the certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Whether `cert` (a client certificate already verified against the CA) names `dns_name` in
/// its subject alternative names.
pub fn certificate_names(cert: &CertificateDer<'_>, dns_name: &str) -> bool {
    let Ok(end_entity) = webpki::EndEntityCert::try_from(cert) else { return false };
    let Ok(name) = rustls::pki_types::ServerName::try_from(dns_name) else { return false };
    end_entity.verify_is_valid_for_subject_name(&name).is_ok()
}
