//! The one rule for names.
//!
//! Every name the API takes (namespace, queue, workflow, task, node id,
//! event name, label key) is 1 to [`MAX_NAME_LEN`] characters from
//! `A-Z a-z 0-9 _ . -`, and starts with a letter or a digit. A name that
//! starts with `_` is reserved for the server (its own queues, such as
//! `_http`). Node ids are also expression identifiers (`nodes.<id>.output`),
//! so they take letters, digits and `_` only, and start with a letter.
//!
//! Names become parts of keys (Redis streams, caches, idempotency scopes):
//! keeping `:`, `{`, `}`, `/`, spaces and control characters out of them is
//! what keeps one tenant's key from ever spelling another's.

use std::fmt;

/// The longest name, in bytes (every allowed character is one byte).
pub const MAX_NAME_LEN: usize = 64;

/// The rule, in words, for error messages and documentation.
pub const NAME_RULE: &str =
    "1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit";

/// The rule for node ids, in words.
pub const IDENTIFIER_RULE: &str = "1 to 64 characters from A-Z a-z 0-9 _, starting with a letter";

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`MAX_NAME_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The name starts with `_`, the server's prefix.
    Reserved,
    /// A character outside the rule, at a character position.
    BadCharacter {
        /// The character.
        found: char,
        /// Its position (0-based, in characters).
        at: usize,
        /// The rule it broke.
        rule: &'static str,
    },
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => write!(f, "must not be empty ({NAME_RULE})"),
            NameError::TooLong { len } => {
                write!(f, "is {len} bytes long; at most {MAX_NAME_LEN} are allowed")
            }
            NameError::Reserved => write!(
                f,
                "names starting with '_' are reserved for the server ({NAME_RULE})"
            ),
            NameError::BadCharacter { found, at, rule } => {
                write!(
                    f,
                    "character {found:?} at position {at} is not allowed ({rule})"
                )
            }
        }
    }
}

impl std::error::Error for NameError {}

/// Checks a name against the rule (see the module's documentation).
pub fn check_name(name: &str) -> Result<(), NameError> {
    check_length(name)?;
    if name.starts_with('_') {
        return Err(NameError::Reserved);
    }
    for (at, found) in name.chars().enumerate() {
        let allowed = if at == 0 {
            found.is_ascii_alphanumeric()
        } else {
            found.is_ascii_alphanumeric() || matches!(found, '_' | '.' | '-')
        };
        if !allowed {
            return Err(NameError::BadCharacter {
                found,
                at,
                rule: NAME_RULE,
            });
        }
    }
    Ok(())
}

/// Checks a node id: a name that is also an expression identifier.
pub fn check_identifier(id: &str) -> Result<(), NameError> {
    check_length(id)?;
    if id.starts_with('_') {
        return Err(NameError::Reserved);
    }
    for (at, found) in id.chars().enumerate() {
        let allowed = if at == 0 {
            found.is_ascii_alphabetic()
        } else {
            found.is_ascii_alphanumeric() || found == '_'
        };
        if !allowed {
            return Err(NameError::BadCharacter {
                found,
                at,
                rule: IDENTIFIER_RULE,
            });
        }
    }
    Ok(())
}

fn check_length(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong { len: name.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for good in [
            "a",
            "order",
            "code.python",
            "q-1_b.c",
            "9lives",
            &"x".repeat(64),
        ] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        assert_eq!(check_name(""), Err(NameError::Empty));
        assert_eq!(
            check_name(&"x".repeat(65)),
            Err(NameError::TooLong { len: 65 })
        );
        assert_eq!(check_name("_http"), Err(NameError::Reserved));
        for bad in [
            "org:prod", "a}b", "a{b", "a b", "a/b", "-a", ".a", "a\0", "é",
        ] {
            assert!(
                matches!(check_name(bad), Err(NameError::BadCharacter { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn node_ids_are_identifiers() {
        assert_eq!(check_identifier("undo_charge"), Ok(()));
        assert_eq!(check_identifier("_x"), Err(NameError::Reserved));
        for bad in ["a.b", "a-b", "1a"] {
            assert!(
                matches!(check_identifier(bad), Err(NameError::BadCharacter { .. })),
                "{bad:?}"
            );
        }
    }
}
