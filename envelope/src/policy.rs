//! Which traffic must be sealed: between cells and between nodes always, a user's as the user chooses.

/// Who is on either end of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PrincipalKind {
    /// Another cell.
    Cell,
    /// A node (of this cell or another).
    Node,
    /// A user's client.
    User,
}

/// A message that the policy refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} traffic must be encrypted; refusing a plain message")]
pub struct PolicyError {
    /// Whose traffic it was.
    pub kind: PrincipalKind,
}

impl PrincipalKind {
    /// Whether traffic of this kind must be sealed.
    pub fn must_encrypt(self) -> bool {
        match self {
            PrincipalKind::Cell | PrincipalKind::Node => true,
            PrincipalKind::User => false,
        }
    }

    /// Accepts a message that is `sealed` (or not) under this kind's policy.
    pub fn check(self, sealed: bool) -> Result<(), PolicyError> {
        if self.must_encrypt() && !sealed { Err(PolicyError { kind: self }) } else { Ok(()) }
    }
}
