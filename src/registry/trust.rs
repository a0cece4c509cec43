//! The certificates a registry's TLS certificate is checked against: the
//! system's trust store (what `ureq`'s `native-certs` reads: the
//! distribution's CA bundle, e.g. /etc/ssl/certs/ca-certificates.crt on
//! Debian, /etc/pki/tls/certs/ca-bundle.crt on RHEL), plus a site CA bundle
//! (`ca_bundle=PATH`, PEM) for registries and proxies signed by a site CA.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// Reads the PEM certificates of `path`; fails, naming the file, when it
/// cannot be read or holds none.
pub fn bundle_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read the CA bundle {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| {
            format!(
                "the CA bundle {} is not PEM certificates (-----BEGIN CERTIFICATE-----)",
                path.display()
            )
        })?;
    if certificates.is_empty() {
        bail!(
            "the CA bundle {} holds no certificate: give a PEM file of the site's CA \
             certificates",
            path.display()
        );
    }
    Ok(certificates)
}

/// TLS settings that trust the system's store and the certificates of the
/// CA bundle at `path`.
pub fn with_ca_bundle(path: &Path) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    // The system store may be missing or partly unreadable: the site bundle
    // alone is still a trust store.
    if let Ok(system) = rustls_native_certs::load_native_certs() {
        roots.add_parsable_certificates(system);
    }
    for certificate in bundle_certificates(path)? {
        roots.add(certificate).with_context(|| {
            format!(
                "a certificate of the CA bundle {} is not a valid CA certificate",
                path.display()
            )
        })?;
    }
    let config = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .context("cannot set up TLS")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_certificates_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("site-ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = format!("{:#}", bundle_certificates(&path).unwrap_err());
        assert!(
            e.contains("site-ca.pem") && e.contains("no certificate"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            with_ca_bundle(&dir.path().join("missing.pem")).unwrap_err()
        );
        assert!(e.contains("cannot read the CA bundle"), "{e}");
    }
}
