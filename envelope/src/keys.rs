//! The cell's key pair and the keyring of other cells' public keys, both kept under the data directory:
//!
//! - `keys/cell.tsk`: this cell's key (secret parts included, readable by its owner only), created on first start;
//! - `keys/peers/<fingerprint>.pgp`: each imported cell's public key.
//!
//! A key names its cell in a user id `cellog-cell:<name>`. Each key has a signing subkey and a transport encryption
//! subkey, on Curve25519, with no expiry (a cell's key lives as long as the cell).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use sequoia_openpgp as openpgp;

use openpgp::Cert;
use openpgp::cert::{CertBuilder, CipherSuite};
use openpgp::parse::Parse;
use openpgp::policy::StandardPolicy;
use openpgp::serialize::{Serialize, SerializeInto};

const USER_ID_PREFIX: &str = "cellog-cell:";
const CELL_KEY_FILE: &str = "cell.tsk";

/// Why a key could not be made, read, imported or found.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing a key file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// Bytes that are not an OpenPGP certificate, or one cellog cannot use.
    #[error("not a usable cell key: {reason}")]
    Unusable {
        /// What is wrong.
        reason: String,
    },
    /// The key in the data directory belongs to another cell.
    #[error("the key in {path} belongs to cell {found:?}, not {expected:?}")]
    OtherCell {
        /// The key file.
        path: PathBuf,
        /// The cell it names.
        found: String,
        /// The cell starting here.
        expected: String,
    },
    /// An import would replace a cell's known key with a different one.
    #[error(
        "cell {cell:?} already has key {known} in the keyring; refusing to replace it with {offered} (remove the old \
         one first if the cell's key really changed)"
    )]
    KeyChanged {
        /// The cell.
        cell: String,
        /// The fingerprint in the keyring.
        known: String,
        /// The fingerprint offered.
        offered: String,
    },
    /// An import of this cell's own key.
    #[error("that is this cell's own key ({fingerprint}); the keyring holds other cells' keys")]
    OwnKey {
        /// Its fingerprint.
        fingerprint: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |error| KeyError::Io { path: path.to_path_buf(), error }
}

fn unusable(reason: impl std::fmt::Display) -> KeyError {
    KeyError::Unusable { reason: reason.to_string() }
}

/// The cell a certificate names in its one `cellog-cell:` user id, counting only user ids its owner bound (valid
/// under the policy): anyone can attach an unsigned user id to a key on its way.
fn cell_of(valid: &openpgp::cert::ValidCert<'_>) -> Result<String, KeyError> {
    let mut cells = valid.userids().filter_map(|uid| {
        let text = std::str::from_utf8(uid.userid().value()).ok()?;
        text.strip_prefix(USER_ID_PREFIX).map(str::to_string)
    });
    match (cells.next(), cells.next()) {
        (Some(cell), None) => Ok(cell),
        (None, _) => Err(unusable(format!("no valid user id of the form {USER_ID_PREFIX}<cell>"))),
        (Some(_), Some(_)) => Err(unusable(format!("more than one {USER_ID_PREFIX} user id"))),
    }
}

/// Checks that `cert` is valid now under the standard policy and has live signing and transport encryption keys.
fn check_usable(cert: &Cert) -> Result<String, KeyError> {
    let policy = StandardPolicy::new();
    let valid = cert.with_policy(&policy, None).map_err(unusable)?;
    if let openpgp::types::RevocationStatus::Revoked(_) = valid.revocation_status() {
        return Err(unusable("the key is revoked"));
    }
    valid.alive().map_err(|error| unusable(format!("the key is not alive: {error}")))?;
    let live = || valid.keys().supported().alive().revoked(false);
    if live().for_signing().next().is_none() {
        return Err(unusable("no live signing key"));
    }
    if live().for_transport_encryption().next().is_none() {
        return Err(unusable("no live transport encryption key"));
    }
    let cell = cell_of(&valid)?;
    if cell.is_empty() || !cell.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.') {
        return Err(unusable(format!("{cell:?} is not a cell name")));
    }
    Ok(cell)
}

/// Writes `bytes` to `path` through a fresh temporary file (never one found in place: it could be a link, or carry
/// looser permissions), synced, then renamed, with `mode` on Unix. Directories are made owner-only.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), KeyError> {
    let dir = path.parent().expect("a key file has a directory");
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_error(dir))?;
    let temporary = path.with_extension("tmp");
    match std::fs::remove_file(&temporary) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(KeyError::Io { path: temporary, error }),
    }
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        let mut file = options.open(&temporary).map_err(io_error(&temporary))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io_error(&temporary))?;
        }
        #[cfg(not(unix))]
        let _ = mode;
        file.write_all(bytes).map_err(io_error(&temporary))?;
        file.sync_all().map_err(io_error(&temporary))?;
    }
    std::fs::rename(&temporary, path).map_err(io_error(path))?;
    std::fs::File::open(dir).and_then(|dir| dir.sync_all()).map_err(io_error(dir))
}

/// This cell's key pair.
#[derive(Clone)]
pub struct CellKey {
    cert: Cert,
    cell: String,
}

impl std::fmt::Debug for CellKey {
    /// The cell and the fingerprint only: the certificate's own `Debug` may show secret material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellKey").field("cell", &self.cell).field("fingerprint", &self.fingerprint()).finish()
    }
}

impl CellKey {
    /// A new key pair for `cell`.
    pub fn generate(cell: &str) -> Result<CellKey, KeyError> {
        CellKey::generate_at(cell, None)
    }

    /// A new key pair for `cell`, valid from `created` on (`None`: now). Test fixtures are made in the past, so that
    /// a simulation whose clock starts earlier than today can use them.
    pub fn generate_at(cell: &str, created: Option<std::time::SystemTime>) -> Result<CellKey, KeyError> {
        let mut builder = CertBuilder::new();
        if let Some(created) = created {
            builder = builder.set_creation_time(created);
        }
        let (cert, _revocation) = builder
            .set_cipher_suite(CipherSuite::Cv25519)
            .add_userid(format!("{USER_ID_PREFIX}{cell}"))
            .add_signing_subkey()
            .add_transport_encryption_subkey()
            .set_validity_period(None)
            .generate()
            .map_err(unusable)?;
        check_usable(&cert)?;
        Ok(CellKey { cert, cell: cell.to_string() })
    }

    /// The key in `data_dir/keys/cell.tsk`, made and stored there first if there is none; `true` when it was made.
    pub fn load_or_create(data_dir: &Path, cell: &str) -> Result<(CellKey, bool), KeyError> {
        let path = data_dir.join("keys").join(CELL_KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key = CellKey::from_tsk(&bytes)?;
                if key.cell != cell {
                    return Err(KeyError::OtherCell { path, found: key.cell, expected: cell.to_string() });
                }
                Ok((key, false))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let key = CellKey::generate(cell)?;
                let mut bytes = Vec::new();
                key.cert.as_tsk().serialize(&mut bytes).map_err(unusable)?;
                write_file(&path, &bytes, 0o600)?;
                Ok((key, true))
            }
            Err(error) => Err(KeyError::Io { path, error }),
        }
    }

    /// Stores this key pair as `data_dir/keys/cell.tsk`, for another node of the same cell: every node of a cell
    /// holds the one cell key, so that whichever leads can open what was sealed for the cell. A node that already
    /// holds it is left as it is; a different key there is refused, never overwritten.
    pub fn store(&self, data_dir: &Path) -> Result<(), KeyError> {
        let path = data_dir.join("keys").join(CELL_KEY_FILE);
        match CellKey::load(data_dir)? {
            Some(found) if found.fingerprint() == self.fingerprint() => Ok(()),
            Some(found) => Err(KeyError::KeyChanged {
                cell: found.cell.clone(),
                known: found.fingerprint(),
                offered: self.fingerprint(),
            }),
            None => write_file(&path, &self.to_tsk(), 0o600),
        }
    }

    /// The key in `data_dir/keys/cell.tsk`, if one was made there.
    pub fn load(data_dir: &Path) -> Result<Option<CellKey>, KeyError> {
        let path = data_dir.join("keys").join(CELL_KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => CellKey::from_tsk(&bytes).map(Some),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(KeyError::Io { path, error }),
        }
    }

    /// A key pair from its serialized form (secret parts included).
    pub fn from_tsk(bytes: &[u8]) -> Result<CellKey, KeyError> {
        let cert = Cert::from_bytes(bytes).map_err(unusable)?;
        if !cert.is_tsk() {
            return Err(unusable("no secret key material"));
        }
        let cell = check_usable(&cert)?;
        Ok(CellKey { cert, cell })
    }

    /// The serialized key pair, secret parts included (for tests and backups; handle with care).
    pub fn to_tsk(&self) -> Vec<u8> {
        self.cert.as_tsk().to_vec().expect("serializing into memory does not fail")
    }

    /// The cell it belongs to.
    pub fn cell(&self) -> &str {
        &self.cell
    }

    /// Its fingerprint (hex).
    pub fn fingerprint(&self) -> String {
        self.cert.fingerprint().to_hex()
    }

    /// The public key, ASCII-armored, to give to other cells.
    pub fn public_armored(&self) -> String {
        let bytes = self.cert.armored().to_vec().expect("serializing into memory does not fail");
        String::from_utf8(bytes).expect("armor is ASCII")
    }

    /// The public certificate.
    pub fn public(&self) -> Cert {
        self.cert.clone().strip_secret_key_material()
    }

    pub(crate) fn cert(&self) -> &Cert {
        &self.cert
    }
}

/// A public key of another cell.
#[derive(Clone, Debug)]
pub struct PeerKey {
    /// The cell.
    pub cell: String,
    /// Its fingerprint (hex).
    pub fingerprint: String,
    /// The certificate (public parts only).
    pub cert: Cert,
}

/// Other cells' public keys, by cell name, kept as files under `keys/peers/`.
#[derive(Clone, Debug)]
pub struct Keyring {
    dir: Option<PathBuf>,
    by_cell: BTreeMap<String, PeerKey>,
}

impl Keyring {
    /// A keyring held in memory only.
    pub fn in_memory() -> Keyring {
        Keyring { dir: None, by_cell: BTreeMap::new() }
    }

    /// The keyring under `data_dir/keys/peers/` (empty when the directory does not exist yet). A file that is not a
    /// usable key is an error naming it: a keyring silently missing a peer would fail sends later and far away.
    pub fn open(data_dir: &Path) -> Result<Keyring, KeyError> {
        let dir = data_dir.join("keys").join("peers");
        let mut keyring = Keyring { dir: Some(dir.clone()), by_cell: BTreeMap::new() };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(keyring),
            Err(error) => return Err(KeyError::Io { path: dir, error }),
        };
        let mut paths: Vec<PathBuf> =
            entries.map(|entry| entry.map(|entry| entry.path())).collect::<Result<_, _>>().map_err(io_error(&dir))?;
        paths.retain(|path| path.extension().is_some_and(|extension| extension == "pgp"));
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).map_err(io_error(&path))?;
            let peer = peer_key(&bytes).map_err(|error| unusable(format!("{}: {error}", path.display())))?;
            if path.file_stem().and_then(|stem| stem.to_str()) != Some(peer.fingerprint.as_str()) {
                return Err(unusable(format!(
                    "{} holds key {}, not the one it is named for",
                    path.display(),
                    peer.fingerprint
                )));
            }
            if let Some(known) = keyring.by_cell.get(&peer.cell) {
                return Err(unusable(format!(
                    "{} is a second key ({}) for cell {:?}, which has {}",
                    path.display(),
                    peer.fingerprint,
                    peer.cell,
                    known.fingerprint
                )));
            }
            keyring.by_cell.insert(peer.cell.clone(), peer);
        }
        Ok(keyring)
    }

    /// Adds another cell's public key (armored or binary), refusing secret parts' storage, unusable keys, this
    /// cell's own key or name (`own`), and a different key for a cell already known. Importing a known key again
    /// merges what is new in it (new signatures, a revocation) into what is kept: an older copy cannot undo a
    /// revocation.
    pub fn import(&mut self, bytes: &[u8], own: Option<&CellKey>) -> Result<PeerKey, KeyError> {
        let mut peer = peer_key(bytes)?;
        if let Some(own) = own
            && (own.fingerprint() == peer.fingerprint || own.cell() == peer.cell)
        {
            return Err(KeyError::OwnKey { fingerprint: peer.fingerprint });
        }
        if let Some(known) = self.by_cell.get(&peer.cell) {
            if known.fingerprint != peer.fingerprint {
                return Err(KeyError::KeyChanged {
                    cell: peer.cell,
                    known: known.fingerprint.clone(),
                    offered: peer.fingerprint,
                });
            }
            let merged = known.cert.clone().merge_public(peer.cert).map_err(unusable)?;
            let cell = check_usable(&merged)?;
            peer = PeerKey { cell, fingerprint: merged.fingerprint().to_hex(), cert: merged };
        }
        if let Some(dir) = &self.dir {
            let mut serialized = Vec::new();
            peer.cert.serialize(&mut serialized).map_err(unusable)?;
            write_file(&dir.join(format!("{}.pgp", peer.fingerprint)), &serialized, 0o644)?;
        }
        self.by_cell.insert(peer.cell.clone(), peer.clone());
        Ok(peer)
    }

    /// Every key, by cell name.
    pub fn list(&self) -> impl Iterator<Item = &PeerKey> {
        self.by_cell.values()
    }

    /// The key of `cell`, if known.
    pub fn get(&self, cell: &str) -> Option<&PeerKey> {
        self.by_cell.get(cell)
    }

    /// The key with this fingerprint (hex), if known.
    pub fn by_fingerprint(&self, fingerprint: &str) -> Option<&PeerKey> {
        self.by_cell.values().find(|peer| peer.fingerprint.eq_ignore_ascii_case(fingerprint))
    }
}

/// A usable public key from `bytes`, secret parts dropped.
fn peer_key(bytes: &[u8]) -> Result<PeerKey, KeyError> {
    let cert = Cert::from_bytes(bytes).map_err(unusable)?.strip_secret_key_material();
    let cell = check_usable(&cert)?;
    Ok(PeerKey { cell, fingerprint: cert.fingerprint().to_hex(), cert })
}
