//! API tokens: what a caller sends (`authorization: Bearer TOKEN` on every call) and the hash a cell keeps of it. A
//! cell never stores a token, only its SHA-256; the token is shown once, when it is made.

use sha2::{Digest, Sha256};

/// The metadata key a call carries its credential under.
pub const AUTHORIZATION: &str = "authorization";
/// The scheme of a token credential.
pub const BEARER: &str = "Bearer ";
/// What every token made by `cellog auth token new` starts with, so that one is recognizable in a config or a leak.
pub const TOKEN_PREFIX: &str = "cellog_";
/// The longest token accepted.
pub const MAX_TOKEN_BYTES: usize = 256;

/// The SHA-256 of a token: what the cell keeps and looks it up by.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A token made of 32 random bytes (hex), prefixed.
pub fn from_random(bytes: [u8; 32]) -> String {
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// Why a token cannot be sent.
pub fn check(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("the token is empty".to_string());
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!("the token is {} bytes long; the limit is {MAX_TOKEN_BYTES}", token.len()));
    }
    if let Some(c) = token.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("the token contains {c:?}; only printable ASCII is allowed"));
    }
    Ok(())
}

/// How `Debug` output shows a secret (a token, a key): whether there is one, never what it is.
pub fn redacted<T>(secret: &Option<T>) -> Option<&'static str> {
    secret.as_ref().map(|_| "<redacted>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_hashes_to_its_sha256() {
        assert_eq!(hex::encode(hash("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn tokens_are_checked_before_they_are_sent() {
        assert!(check(&from_random([7; 32])).is_ok());
        assert!(check("").is_err());
        assert!(check("with space").is_err());
        assert!(check(&"x".repeat(MAX_TOKEN_BYTES + 1)).is_err());
    }
}
