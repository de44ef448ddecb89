//! Mutual TLS on a node's ports, under one cell CA: the node serves its client and peer ports with its certificate,
//! and dials its peers with the same one. A peer must present a certificate of the cell's CA that names a node of
//! this cell ([`Named::node`]); a client may present one that names its principal ([`Named::principal`]), or send a token.
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
    use std::sync::{Arc, Mutex, RwLock};
    use std::time::{Duration, SystemTime};

    use tokio_rustls::rustls;
    use tokio_rustls::rustls::crypto::CryptoProvider;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
    use tokio_rustls::rustls::sign::CertifiedKey;
    use x509_parser::extensions::GeneralName;

    use super::TlsFiles;

    /// Whether the cell revokes the certificate with a serial (as its DER encodes it).
    pub type IsRevoked = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

    /// How often a node looks at its certificate, key and CA files for a rotated certificate (`cellog certs rotate`
    /// writes new ones in place) or a changed CA (one that adds a new CA's certificate beside the old while a cell
    /// moves to it): the next handshake after a change serves the new certificate and verifies against the new CA,
    /// and calls to peers dial with them, without a restart; connections already open go on as they began.
    pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

    /// A node's TLS material: the cell's CA, and its own certificate and key, read again from their files when they
    /// change (see [`RELOAD_EVERY`]).
    #[derive(Clone, Debug)]
    pub struct NodeTls {
        shared: Arc<Shared>,
    }

    #[derive(Debug)]
    struct Shared {
        files: TlsFiles,
        current: RwLock<Arc<Loaded>>,
        /// When the files were last looked at.
        checked: Mutex<std::time::Instant>,
    }

    /// The node's certificate and key, and the CA, as last read.
    #[derive(Debug)]
    struct Loaded {
        cert: Vec<u8>,
        key: Vec<u8>,
        ca: Vec<u8>,
        roots: Arc<rustls::RootCertStore>,
        /// The files' modification times when read (certificate, key, CA): a change makes the next look read them
        /// again.
        modified: [Option<SystemTime>; 3],
        certified: Arc<CertifiedKey>,
        /// How many times the files were read with a change (0: as the node started).
        generation: u64,
    }

    fn read(what: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|error| format!("reading the {what} in {}: {error}", path.display()))
    }

    fn modified(path: &std::path::Path) -> Option<SystemTime> {
        std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok()
    }

    /// The crypto every port of the node uses, named rather than taken from the process's default (which another
    /// crate may set).
    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn modified_times(files: &TlsFiles) -> [Option<SystemTime>; 3] {
        [modified(&files.cert), modified(&files.key), modified(&files.ca)]
    }

    /// The roots a CA file holds (one certificate, or more while a cell moves to a new CA).
    fn roots_of(ca: &[u8]) -> Result<Arc<rustls::RootCertStore>, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|error| format!("the CA certificate: {error}"))?;
            roots.add(cert).map_err(|error| format!("the CA certificate: {error}"))?;
        }
        if roots.is_empty() {
            return Err("the CA certificate is not a PEM certificate".to_string());
        }
        Ok(Arc::new(roots))
    }

    impl Loaded {
        fn read(files: &TlsFiles, generation: u64) -> Result<Loaded, String> {
            let modified = modified_times(files);
            let cert = read("node certificate", &files.cert)?;
            let key = read("node key", &files.key)?;
            let ca = read("CA certificate", &files.ca)?;
            let roots = roots_of(&ca)?;
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| format!("the node certificate: {error}"))?;
            if chain.is_empty() {
                return Err("the node certificate is not a PEM certificate".to_string());
            }
            let der = PrivateKeyDer::from_pem_slice(&key).map_err(|error| format!("the node key: {error}"))?;
            let certified = CertifiedKey::from_der(chain, der, &provider())
                .map_err(|error| format!("the node certificate and key do not go together: {error}"))?;
            Ok(Loaded { cert, key, ca, roots, modified, certified: Arc::new(certified), generation })
        }
    }

    impl NodeTls {
        /// Reads the files.
        pub fn load(files: &TlsFiles) -> Result<Self, String> {
            let loaded = Loaded::read(files, 0)?;
            #[allow(clippy::disallowed_methods, reason = "when the node's own files were last looked at")]
            let checked = Mutex::new(std::time::Instant::now());
            let shared = Shared { files: files.clone(), current: RwLock::new(Arc::new(loaded)), checked };
            Ok(NodeTls { shared: Arc::new(shared) })
        }

        /// The certificate and key as they are now: read again first when the files changed since the last look
        /// (at most every [`RELOAD_EVERY`]). A changed file that does not load (half written, or a key of another
        /// certificate) leaves the one in use, and is looked at again at the next change.
        fn current(&self) -> Arc<Loaded> {
            let shared = &self.shared;
            #[allow(clippy::disallowed_methods, reason = "when the node's own files were last looked at")]
            let now = std::time::Instant::now();
            let due = {
                let mut checked = shared.checked.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let due = now.duration_since(*checked) >= RELOAD_EVERY;
                if due {
                    *checked = now;
                }
                due
            };
            let current = shared.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
            if !due || modified_times(&shared.files) == current.modified {
                return current;
            }
            match Loaded::read(&shared.files, current.generation + 1) {
                Ok(loaded) if loaded.cert == current.cert && loaded.key == current.key && loaded.ca == current.ca => {
                    current
                }
                Ok(loaded) => {
                    let loaded = Arc::new(loaded);
                    tracing::info!(
                        cert = %shared.files.cert.display(),
                        ca = %shared.files.ca.display(),
                        "serving the node's rotated certificate and CA"
                    );
                    *shared.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = loaded.clone();
                    loaded
                }
                Err(error) => {
                    tracing::warn!(%error, "the node's changed certificate files do not load; keeping the one in use");
                    current
                }
            }
        }

        /// How many times the node's certificate or CA changed since it started: a peer link made with an earlier
        /// one dials again.
        pub fn generation(&self) -> u64 {
            self.current().generation
        }

        /// The DER of the certificate the node presents now.
        pub fn certificate_der(&self) -> Vec<u8> {
            self.current().certified.cert.first().map(|cert| cert.to_vec()).unwrap_or_default()
        }

        /// A server configuration presenting the node's current certificate, with `verifier` for clients' ones.
        fn server(
            &self,
            client_auth: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
            alpn: &[u8],
        ) -> Result<tokio_rustls::TlsAcceptor, String> {
            let builder = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|error| format!("the TLS configuration is refused: {error}"))?;
            let builder = match client_auth {
                Some(verifier) => builder.with_client_cert_verifier(verifier),
                None => builder.with_no_client_auth(),
            };
            let mut config = builder.with_cert_resolver(Arc::new(Rotating(self.clone())));
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
        }

        fn client_verifier(
            &self,
            required: bool,
        ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
            // Built once here, so that a verifier the CA refuses fails the node's start rather than a handshake.
            client_verifier_of(&self.current().roots, required)?;
            Ok(Arc::new(RotatingClientVerifier { tls: self.clone(), required }))
        }

        /// The client port: a client certificate is checked against the CA if one is sent, but not required (a token
        /// will do).
        pub fn client_port(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
            self.server(Some(self.client_verifier(false)?), b"h2")
        }

        /// The peer port: a certificate of the cell's CA is required.
        pub fn peer_port(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
            self.server(Some(self.client_verifier(true)?), b"h2")
        }

        /// HTTPS on the HTTP port, with this node's certificate. Callers there authenticate with a token; no client
        /// certificate is asked for.
        pub fn http_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
            self.server(None, b"http/1.1")
        }

        /// The cell's CA certificate (PEM), as last read.
        pub fn ca_pem(&self) -> Vec<u8> {
            self.current().ca.clone()
        }

        /// Dialing a peer: its certificate must chain to the CA as it is now (and name the address dialed), name a
        /// node of `cell`, and not be revoked (`revoked` says, by serial); this node's current certificate goes with
        /// the call. The connection speaks HTTP/2.
        pub fn dial(&self, cell: &str, revoked: IsRevoked) -> Result<rustls::ClientConfig, String> {
            let current = self.current();
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(current.roots.clone(), provider())
                .build()
                .map_err(|error| format!("the peer certificate verifier is refused: {error}"))?;
            let verifier = PeerVerifier { webpki, cell: cell.to_string(), revoked };
            let mut config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|error| format!("the TLS configuration is refused: {error}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_client_cert_resolver(Arc::new(RotatingClient(self.clone())));
            config.alpn_protocols = vec![b"h2".to_vec()];
            Ok(config)
        }
    }

    fn client_verifier_of(
        roots: &Arc<rustls::RootCertStore>,
        required: bool,
    ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
        let builder = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider());
        let builder = if required { builder } else { builder.allow_unauthenticated() };
        builder.build().map_err(|error| format!("the client certificate verifier is refused: {error}"))
    }

    /// Verifies a client's certificate against the CA as the node has it at the handshake (see [`RELOAD_EVERY`]).
    #[derive(Debug)]
    struct RotatingClientVerifier {
        tls: NodeTls,
        required: bool,
    }

    impl RotatingClientVerifier {
        /// The verifier of the CA as it is now, or the refusal of every certificate when that CA builds none (a
        /// node never falls back to accepting what it cannot verify).
        fn now(&self) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, rustls::Error> {
            client_verifier_of(&self.tls.current().roots, self.required).map_err(rustls::Error::General)
        }
    }

    impl rustls::server::danger::ClientCertVerifier for RotatingClientVerifier {
        fn offer_client_auth(&self) -> bool {
            true
        }

        fn client_auth_mandatory(&self) -> bool {
            self.required
        }

        fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
            // No hints: they would have to outlive a rotation of the CA.
            &[]
        }

        fn verify_client_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            now: rustls::pki_types::UnixTime,
        ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
            self.now()?.verify_client_cert(end_entity, intermediates, now)
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &provider().signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &provider().signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            provider().signature_verification_algorithms.supported_schemes()
        }
    }

    /// Verifies the peer a node dials: a certificate of the CA for the address dialed, naming a node of the cell,
    /// and not revoked.
    struct PeerVerifier {
        webpki: Arc<rustls::client::WebPkiServerVerifier>,
        cell: String,
        revoked: IsRevoked,
    }

    impl std::fmt::Debug for PeerVerifier {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PeerVerifier").field("cell", &self.cell).finish_non_exhaustive()
        }
    }

    impl rustls::client::danger::ServerCertVerifier for PeerVerifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &rustls::pki_types::ServerName<'_>,
            ocsp_response: &[u8],
            now: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            let verified =
                self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
            let refused = |why: &str| rustls::Error::General(format!("the peer's certificate {why}"));
            let Some(named) = Named::read(end_entity) else { return Err(refused("does not parse")) };
            match named.node() {
                Some((cell, _)) if cell == self.cell => {}
                _ => return Err(refused("names no node of this cell")),
            }
            if (self.revoked)(named.serial()) {
                return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked));
            }
            Ok(verified)
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            self.webpki.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            self.webpki.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.webpki.supported_verify_schemes()
        }
    }

    /// The node's certificate to each peer it dials, as [`NodeTls`] has it now.
    #[derive(Debug)]
    struct RotatingClient(NodeTls);

    impl rustls::client::ResolvesClientCert for RotatingClient {
        fn resolve(
            &self,
            _root_hint_subjects: &[&[u8]],
            _sigschemes: &[rustls::SignatureScheme],
        ) -> Option<Arc<CertifiedKey>> {
            Some(self.0.current().certified.clone())
        }

        fn has_certs(&self) -> bool {
            true
        }
    }

    /// The node's certificate to each handshake, as [`NodeTls`] has it now.
    #[derive(Debug)]
    struct Rotating(NodeTls);

    impl ResolvesServerCert for Rotating {
        fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            Some(self.0.current().certified.clone())
        }
    }

    /// Connections of `incoming`, each once its TLS handshake (under `timeout`) is done; many handshake at once, and
    /// one that fails or times out is dropped without ending the stream.
    pub fn handshaken<S, T, E>(
        incoming: S,
        acceptor: tokio_rustls::TlsAcceptor,
        timeout: Duration,
    ) -> impl futures::Stream<Item = Result<tokio_rustls::server::TlsStream<T>, E>> + Send + 'static
    where
        S: futures::Stream<Item = Result<T, E>> + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        E: Send + 'static,
    {
        use futures::StreamExt;
        /// Handshakes under way on one port at once.
        const HANDSHAKING: usize = 256;
        incoming
            .map(move |accepted| {
                let acceptor = acceptor.clone();
                async move {
                    let stream = match accepted {
                        Ok(stream) => stream,
                        Err(error) => return Some(Err(error)),
                    };
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => Some(Ok(tls)),
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "a TLS handshake failed");
                            None
                        }
                        Err(_) => {
                            tracing::debug!("a TLS handshake timed out");
                            None
                        }
                    }
                }
            })
            .buffer_unordered(HANDSHAKING)
            .filter_map(std::future::ready)
    }

    /// What a DER certificate names, read in one parse: its `cellog://` URIs and its serial.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Named {
        uris: Vec<String>,
        serial: Vec<u8>,
    }

    impl Named {
        /// What `der` names, or `None` when it does not parse.
        pub fn read(der: &[u8]) -> Option<Named> {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            let uris = match cert.subject_alternative_name() {
                Ok(Some(names)) => names
                    .value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        GeneralName::URI(uri) if uri.starts_with("cellog://") => Some(uri.to_string()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            Some(Named { uris, serial: cert.raw_serial().to_vec() })
        }

        /// Its serial number, as its DER encodes it (what the cell revokes a certificate by).
        pub fn serial(&self) -> &[u8] {
            &self.serial
        }

        /// The cell and node it names (`cellog://CELL/node/ID`).
        pub fn node(&self) -> Option<(String, u64)> {
            self.uris.iter().find_map(|uri| {
                let rest = uri.strip_prefix("cellog://")?;
                let (cell, id) = rest.split_once("/node/")?;
                Some((cell.to_string(), id.parse().ok()?))
            })
        }

        /// The cell and principal it names (`cellog://CELL/principal/NAME`).
        pub fn principal(&self) -> Option<(String, String)> {
            self.uris.iter().find_map(|uri| {
                let rest = uri.strip_prefix("cellog://")?;
                let (cell, name) = rest.split_once("/principal/")?;
                Some((cell.to_string(), name.to_string()))
            })
        }
    }

    /// The addresses and host names a PEM certificate is for (its IP and DNS subject alternative names).
    pub fn hosts_of(pem: &[u8]) -> Result<Vec<String>, String> {
        let (_, pem) =
            x509_parser::pem::parse_x509_pem(pem).map_err(|error| format!("not a PEM certificate: {error}"))?;
        let cert = pem.parse_x509().map_err(|error| format!("the certificate does not parse: {error}"))?;
        let Ok(Some(names)) = cert.subject_alternative_name() else { return Ok(Vec::new()) };
        Ok(names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(host) => Some(host.to_string()),
                GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => <[u8; 4]>::try_from(*bytes).ok().map(|ip| std::net::IpAddr::from(ip).to_string()),
                    16 => <[u8; 16]>::try_from(*bytes).ok().map(|ip| std::net::IpAddr::from(ip).to_string()),
                    _ => None,
                },
                _ => None,
            })
            .collect())
    }

    /// When a PEM certificate ends, in seconds since the epoch.
    pub fn not_after_of(pem: &[u8]) -> Result<i64, String> {
        let (_, pem) =
            x509_parser::pem::parse_x509_pem(pem).map_err(|error| format!("not a PEM certificate: {error}"))?;
        let cert = pem.parse_x509().map_err(|error| format!("the certificate does not parse: {error}"))?;
        Ok(cert.validity().not_after.timestamp())
    }

    /// A certificate's serial number, as its DER encodes it (what the cell revokes a certificate by).
    pub fn serial_of(der: &[u8]) -> Option<Vec<u8>> {
        Named::read(der).map(|named| named.serial)
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
        let names = Named::read(&pem.contents)
            .and_then(|named| named.uris.into_iter().next())
            .unwrap_or_else(|| cert.subject().to_string());
        let until_ms = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0).saturating_mul(1000);
        Ok(CertificateFacts { serial: cert.raw_serial().to_vec(), names, until_ms })
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
