//! Names: subjects, subject filters, stream and consumer names, and the stable partition hash.
//!
//! A subject is a hierarchy of tokens separated by `.` (`orders.eu.created`). A filter may use `*` for exactly one
//! token and `>` as its last token for one or more tokens (`orders.*.created`, `orders.>`). Published subjects never
//! contain wildcards.
//!
//! A first token that starts with `@` is a tenant's scope (`@acme.orders.created`, see [`crate::tenant`]): a wildcard
//! in the first position never matches it, so `>` and `*.created` stay within the cell's own subjects and no filter
//! reaches into a tenant's subjects without naming the tenant.

use serde::{Deserialize, Serialize};

/// The longest subject or filter, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 255;
/// The longest stream, consumer or member name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Why a subject or filter was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SubjectError {
    /// The subject is the empty string.
    #[error("subject is empty")]
    Empty,
    /// The subject is longer than [`MAX_SUBJECT_BYTES`].
    #[error("subject is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Two dots in a row, or a leading or trailing dot.
    #[error("token {position} is empty (leading, trailing or doubled '.')")]
    EmptyToken {
        /// Zero-based index of the empty token.
        position: usize,
    },
    /// A whitespace or control character.
    #[error("character {ch:?} at byte {position} is not allowed in a subject")]
    InvalidChar {
        /// The character.
        ch: char,
        /// Its byte offset.
        position: usize,
    },
    /// A wildcard in a subject that is published to.
    #[error("wildcards ('*', '>') are only allowed in filters, not in published subjects")]
    WildcardInPublish,
    /// `>` somewhere other than the last token.
    #[error("'>' must be the last token of a filter")]
    FullWildcardNotLast,
    /// A token that mixes a wildcard with other characters, such as `ord*`.
    #[error("token {token:?} mixes a wildcard with other characters")]
    PartialWildcard {
        /// The offending token.
        token: String,
    },
}

/// Checks length, characters and tokens in one pass over the bytes; returns whether a `*` or `>` was seen.
fn check_common(subject: &str) -> Result<bool, SubjectError> {
    if subject.is_empty() {
        return Err(SubjectError::Empty);
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(SubjectError::TooLong { len: subject.len(), max: MAX_SUBJECT_BYTES });
    }
    let mut has_wildcard = false;
    let mut non_ascii = false;
    let mut token = 0usize;
    let mut token_empty = true;
    for (position, byte) in subject.bytes().enumerate() {
        match byte {
            b'.' => {
                if token_empty {
                    return Err(SubjectError::EmptyToken { position: token });
                }
                token += 1;
                token_empty = true;
            }
            b'*' | b'>' => {
                has_wildcard = true;
                token_empty = false;
            }
            0x21..=0x7e => token_empty = false,
            _ if byte.is_ascii() => {
                return Err(SubjectError::InvalidChar { ch: char::from(byte), position });
            }
            // Non-ASCII: checked per character below, which is rare enough not to matter.
            _ => {
                token_empty = false;
                non_ascii = true;
            }
        }
    }
    if token_empty {
        return Err(SubjectError::EmptyToken { position: token });
    }
    if non_ascii && let Some((position, ch)) = subject.char_indices().find(|(_, c)| c.is_whitespace() || c.is_control())
    {
        return Err(SubjectError::InvalidChar { ch, position });
    }
    Ok(has_wildcard)
}

/// Checks a subject that a message is published to: no wildcards.
pub fn validate_subject(subject: &str) -> Result<(), SubjectError> {
    if check_common(subject)? {
        return Err(SubjectError::WildcardInPublish);
    }
    Ok(())
}

/// Checks a subject filter: `*` as a whole token, `>` as the whole last token.
pub fn validate_filter(filter: &str) -> Result<(), SubjectError> {
    check_common(filter)?;
    let n_tokens = filter.split('.').count();
    for (index, token) in filter.split('.').enumerate() {
        match token {
            "*" => {}
            ">" if index + 1 == n_tokens => {}
            ">" => return Err(SubjectError::FullWildcardNotLast),
            _ if token.contains(['*', '>']) => return Err(SubjectError::PartialWildcard { token: token.to_string() }),
            _ => {}
        }
    }
    Ok(())
}

/// The character that starts a tenant's scope token.
pub const SCOPE_SIGIL: char = '@';

/// Whether a subject's or filter's first token is a tenant's scope token.
pub fn is_scoped(subject: &str) -> bool {
    subject.starts_with(SCOPE_SIGIL)
}

/// Whether a valid filter's first token is a wildcard (in a valid filter, a token holding `*` or `>` is nothing else).
fn wildcard_first(filter: &str) -> bool {
    matches!(filter.as_bytes().first(), Some(b'*' | b'>'))
}

/// Whether `subject` (no wildcards) matches `filter`. Both are assumed valid.
pub fn filter_matches(filter: &str, subject: &str) -> bool {
    if wildcard_first(filter) && is_scoped(subject) {
        return false;
    }
    let mut subject_tokens = subject.as_bytes().split(|byte| *byte == b'.');
    for filter_token in filter.as_bytes().split(|byte| *byte == b'.') {
        match (filter_token, subject_tokens.next()) {
            (b">", Some(_)) => return true,
            (_, None) => return false,
            (b"*", Some(_)) => {}
            (expected, Some(actual)) if expected == actual => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// Whether some subject matches both filters. Used to keep streams from claiming the same subjects.
pub fn filters_overlap(a: &str, b: &str) -> bool {
    if (wildcard_first(a) && is_scoped(b)) || (wildcard_first(b) && is_scoped(a)) {
        return false;
    }
    let mut a_tokens = a.split('.');
    let mut b_tokens = b.split('.');
    loop {
        match (a_tokens.next(), b_tokens.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some("*"), Some(_)) | (Some(_), Some("*")) => {}
            (Some(x), Some(y)) if x == y => {}
            _ => return false,
        }
    }
}

/// Whether every subject `inner` matches is matched by `outer` (both valid filters): a grant of `outer` covers a
/// stream that claims `inner`.
pub fn filter_covers(outer: &str, inner: &str) -> bool {
    if wildcard_first(outer) && is_scoped(inner) {
        return false;
    }
    let mut outer_tokens = outer.split('.');
    let mut inner_tokens = inner.split('.');
    loop {
        match (outer_tokens.next(), inner_tokens.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) => return true,
            // `inner` goes on (or ends in `>`) where `outer` has ended or matches one token only.
            (_, Some(">")) | (None, Some(_)) | (Some(_), None) => return false,
            (Some("*"), Some(_)) => {}
            (Some(x), Some(y)) if x == y && y != "*" => {}
            _ => return false,
        }
    }
}

/// Checks a stream, consumer or member name: 1 to 64 bytes of ASCII letters, digits, `-` and `_`.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".to_string());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("is {} bytes long; the limit is {MAX_NAME_BYTES}", name.len()));
    }
    if let Some(ch) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(format!("contains {ch:?}; only ASCII letters, digits, '-' and '_' are allowed"));
    }
    Ok(())
}

/// The character between a tenant and a name: `acme/alice`, `acme/orders`.
pub const TENANT_SEPARATOR: char = '/';

/// The tenant a principal, stream or transactional id belongs to, if any: what comes before its `/`.
pub fn tenant_of(name: &str) -> Option<&str> {
    name.split_once(TENANT_SEPARATOR).map(|(tenant, _)| tenant)
}

/// Checks a name that may belong to a tenant (a principal, or a stream named by one of the cell's principals): `NAME`
/// or `TENANT/NAME`, each part a valid name.
pub fn validate_scoped_name(name: &str) -> Result<(), String> {
    match name.split_once(TENANT_SEPARATOR) {
        Some((tenant, rest)) => {
            validate_name(tenant).map_err(|reason| format!("its tenant {tenant:?} {reason}"))?;
            validate_name(rest).map_err(|reason| format!("after the tenant, {rest:?} {reason}"))
        }
        None => validate_name(name),
    }
}

/// The tenant a subject or filter belongs to, if its first token is a scope token (`@acme`).
pub fn subject_tenant(subject: &str) -> Option<&str> {
    subject.strip_prefix(SCOPE_SIGIL).map(|rest| rest.split('.').next().unwrap_or(rest))
}

/// A tenant's stored name of `name` (a stream, a transactional id): `TENANT/NAME`.
pub fn scoped_name(tenant: &str, name: &str) -> String {
    format!("{tenant}{TENANT_SEPARATOR}{name}")
}

/// A tenant's stored subject or filter of `subject`: `@TENANT.SUBJECT`.
pub fn scoped_subject(tenant: &str, subject: &str) -> String {
    format!("{SCOPE_SIGIL}{tenant}.{subject}")
}

/// The partition a key belongs to: crc32c (Castagnoli) of the key, modulo the partition count.
///
/// crc32c is fixed by its specification, so the mapping never changes across versions, platforms or processes,
/// which is what keeps every message of one key in one partition for the life of a stream.
pub fn partition_for_key(key: &[u8], n_partitions: u32) -> u32 {
    assert!(n_partitions > 0, "a stream has at least one partition");
    crc32c::crc32c(key) % n_partitions
}
