//! Mutual TLS on a node's ports, under one cell CA: the node serves its client and peer ports with its certificate,
//! and dials its peers with the same one. A peer must present a certificate of the cell's CA that names a node of
//! this cell ([`node_of`]); a client may present one that names its principal ([`principal_of`]), or send a token.
//!
//! Certificates carry who they name in a URI subject alternative name: `cellog://CELL/node/ID` for a node,
//! `cellog://CELL/principal/NAME` for a client (made by `cellog certs`).

use std::path::PathBuf;

/// Where a node's TLS material is: the cell CA's certificate, and this node's certificate and key (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cell CA's certificate: peers and client certificates must chain to it.
    pub ca: PathBuf,
    /// This node's certificate (it names the node: `cellog://CELL/node/ID`, and the addresses it is reached at).
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
}

/// The URI a node's certificate names it by.
pub fn node_uri(cell: &str, id: u64) -> String {
    format!("cellog://{cell}/node/{id}")
}

/// The URI a client certificate names its principal by.
pub fn principal_uri(cell: &str, principal: &str) -> String {
    format!("cellog://{cell}/principal/{principal}")
}

#[cfg(not(madsim))]
pub use real::*;

#[cfg(not(madsim))]
mod real {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
    use x509_parser::extensions::GeneralName;

    use super::TlsFiles;

    /// A node's TLS material, loaded.
    #[derive(Clone, Debug)]
    pub struct NodeTls {
        ca: Vec<u8>,
        cert: Vec<u8>,
        key: Vec<u8>,
    }

    fn read(what: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|error| format!("reading the {what} in {}: {error}", path.display()))
    }

    impl NodeTls {
        /// Reads the files.
        pub fn load(files: &TlsFiles) -> Result<Self, String> {
            let tls = NodeTls {
                ca: read("CA certificate", &files.ca)?,
                cert: read("node certificate", &files.cert)?,
                key: read("node key", &files.key)?,
            };
            for (what, pem) in [("CA certificate", &tls.ca), ("node certificate", &tls.cert)] {
                if !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(format!("the {what} is not a PEM certificate"));
                }
            }
            Ok(tls)
        }

        fn identity(&self) -> Identity {
            Identity::from_pem(&self.cert, &self.key)
        }

        /// The client port: a client certificate is checked against the CA if one is sent, but not required (a token
        /// will do).
        pub fn client_port(&self) -> ServerTlsConfig {
            ServerTlsConfig::new()
                .identity(self.identity())
                .client_ca_root(Certificate::from_pem(&self.ca))
                .client_auth_optional(true)
                .timeout(crate::limits::HANDSHAKE_TIMEOUT)
        }

        /// The peer port: a certificate of the cell's CA is required.
        pub fn peer_port(&self) -> ServerTlsConfig {
            ServerTlsConfig::new()
                .identity(self.identity())
                .client_ca_root(Certificate::from_pem(&self.ca))
                .timeout(crate::limits::HANDSHAKE_TIMEOUT)
        }

        /// HTTPS on the HTTP port, with this node's certificate. Callers there authenticate with a token; no client
        /// certificate is asked for.
        pub fn http_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
            use tokio_rustls::rustls;
            use tokio_rustls::rustls::pki_types::pem::PemObject;
            use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

            let certs = CertificateDer::pem_slice_iter(&self.cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| format!("the node certificate: {error}"))?;
            let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|error| format!("the node key: {error}"))?;
            // The provider is named here rather than taken from the process's default, which another crate may set.
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .and_then(|builder| builder.with_no_client_auth().with_single_cert(certs, key))
                .map_err(|error| format!("the HTTPS configuration is refused: {error}"))?;
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
        }

        /// The cell's CA certificate (PEM).
        pub fn ca_pem(&self) -> &[u8] {
            &self.ca
        }

        /// Dialing a peer: its certificate must chain to the CA (and name the address dialed); this node's own
        /// certificate goes with the call.
        pub fn dial(&self) -> ClientTlsConfig {
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca)).identity(self.identity())
        }
    }

    /// The `cellog://` URIs a DER certificate names.
    fn uris(der: &[u8]) -> Vec<String> {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else { return Vec::new() };
        let Ok(Some(names)) = cert.subject_alternative_name() else { return Vec::new() };
        names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) if uri.starts_with("cellog://") => Some(uri.to_string()),
                _ => None,
            })
            .collect()
    }

    /// A certificate's serial number, as its DER encodes it (what the cell revokes a certificate by).
    pub fn serial_of(der: &[u8]) -> Option<Vec<u8>> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        Some(cert.raw_serial().to_vec())
    }

    /// What the cell needs to revoke a certificate: its serial, what it names, and when it ends.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct CertificateFacts {
        /// Its serial number, as its DER encodes it.
        pub serial: Vec<u8>,
        /// The `cellog://` URI it names (or its subject, when it names none).
        pub names: String,
        /// When it ends, in milliseconds since the epoch.
        pub until_ms: u64,
    }

    /// The facts of a PEM certificate.
    pub fn certificate_facts(pem: &[u8]) -> Result<CertificateFacts, String> {
        let (_, pem) =
            x509_parser::pem::parse_x509_pem(pem).map_err(|error| format!("not a PEM certificate: {error}"))?;
        let cert = pem.parse_x509().map_err(|error| format!("the certificate does not parse: {error}"))?;
        let names = uris(&pem.contents).into_iter().next().unwrap_or_else(|| cert.subject().to_string());
        let until_ms = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0).saturating_mul(1000);
        Ok(CertificateFacts { serial: cert.raw_serial().to_vec(), names, until_ms })
    }

    /// The cell and node a peer's certificate names (`cellog://CELL/node/ID`).
    pub fn node_of(der: &[u8]) -> Option<(String, u64)> {
        uris(der).into_iter().find_map(|uri| {
            let rest = uri.strip_prefix("cellog://")?;
            let (cell, id) = rest.split_once("/node/")?;
            Some((cell.to_string(), id.parse().ok()?))
        })
    }

    /// The cell and principal a client certificate names (`cellog://CELL/principal/NAME`).
    pub fn principal_of(der: &[u8]) -> Option<(String, String)> {
        uris(der).into_iter().find_map(|uri| {
            let rest = uri.strip_prefix("cellog://")?;
            let (cell, name) = rest.split_once("/principal/")?;
            Some((cell.to_string(), name.to_string()))
        })
    }
}

/// No TLS in simulation (madsim's network has none): nothing makes one of these.
#[cfg(madsim)]
#[derive(Clone, Debug)]
pub enum NodeTls {}

#[cfg(madsim)]
impl NodeTls {
    /// Refused: a simulated node serves without TLS.
    pub fn load(_files: &TlsFiles) -> Result<Self, String> {
        Err("TLS is not available in simulation".to_string())
    }
}
