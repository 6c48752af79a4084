//! The keys of the secret store (decision 0044): key-encryption keys the
//! operator gives the server, and per-namespace data keys sealed under
//! them. AES-256-GCM (ring) for both layers, a fresh random 96-bit nonce
//! per seal, and associated data that binds each sealed value to its place.

use std::path::Path;

use ring::{
    aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    digest,
    rand::{SecureRandom, SystemRandom},
};

/// Bytes of a key (either layer).
pub const KEY_BYTES: usize = 32;

/// Why a key or a sealed value could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A key file's content.
    #[error("{path}: {problem}")]
    BadKeyFile { path: String, problem: String },
    /// The server was given no key-encryption key.
    #[error(
        "this server has no secrets key-encryption key (--secrets-key-file): secrets cannot be \
         set or used"
    )]
    NoKeys,
    /// A data key wrapped by a key this server was not given.
    #[error(
        "the namespace's data key is wrapped by key {0}, which this server was not given \
         (--secrets-key-file); give it, or rewrap on a server that has it"
    )]
    UnknownKek(String),
    /// Sealed bytes that do not open: tampered with, or moved.
    #[error("a sealed {0} does not open: it was altered or belongs elsewhere")]
    DoesNotOpen(&'static str),
    /// The system's random source failed.
    #[error("no random bytes from the system")]
    NoRandom,
}

/// One key-encryption key: its id (a fingerprint, safe to store and show)
/// and the key.
struct Kek {
    id: String,
    key: LessSafeKey,
}

/// The key-encryption keys a server was given: the first wraps new data
/// keys (and rewraps), all unwrap.
#[derive(Default)]
pub struct KeyRing {
    keks: Vec<Kek>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keks.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("KeyRing").field("ids", &ids).finish()
    }
}

impl KeyRing {
    /// Reads each file as a key: 64 hexadecimal digits (32 bytes), spaces
    /// and line ends around them ignored.
    pub fn from_files(paths: &[impl AsRef<Path>]) -> Result<KeyRing, KeyError> {
        let mut keks = Vec::with_capacity(paths.len());
        for path in paths {
            let path = path.as_ref();
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| KeyError::BadKeyFile {
                path: shown.clone(),
                problem: e.to_string(),
            })?;
            let key = parse_hex_key(&text).map_err(|problem| KeyError::BadKeyFile {
                path: shown,
                problem,
            })?;
            keks.push(kek(&key));
        }
        Ok(KeyRing { keks })
    }

    /// A ring of these keys, first first.
    pub fn from_keys(keys: &[[u8; KEY_BYTES]]) -> KeyRing {
        KeyRing {
            keks: keys.iter().map(kek).collect(),
        }
    }

    /// Whether the server was given any key.
    pub fn is_empty(&self) -> bool {
        self.keks.is_empty()
    }

    /// The id of the key that wraps (the first).
    pub fn wrapping_id(&self) -> Result<&str, KeyError> {
        self.keks
            .first()
            .map(|k| k.id.as_str())
            .ok_or(KeyError::NoKeys)
    }

    /// A new random data key wrapped for `namespace` by the first key:
    /// (the key, the id of the key that wraps it, the wrapped bytes).
    pub fn new_data_key(
        &self,
        namespace: &str,
    ) -> Result<([u8; KEY_BYTES], String, Vec<u8>), KeyError> {
        let mut key = [0u8; KEY_BYTES];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| KeyError::NoRandom)?;
        let (id, wrapped) = self.wrap(namespace, &key)?;
        Ok((key, id, wrapped))
    }

    /// `data_key` wrapped for `namespace` by the first key.
    pub fn wrap(
        &self,
        namespace: &str,
        data_key: &[u8; KEY_BYTES],
    ) -> Result<(String, Vec<u8>), KeyError> {
        let kek = self.keks.first().ok_or(KeyError::NoKeys)?;
        let wrapped = seal(&kek.key, &wrap_aad(namespace), data_key)?;
        Ok((kek.id.clone(), wrapped))
    }

    /// The data key of `namespace`, unwrapped by the key `kek_id` names.
    pub fn unwrap(
        &self,
        namespace: &str,
        kek_id: &str,
        wrapped: &[u8],
    ) -> Result<[u8; KEY_BYTES], KeyError> {
        if self.keks.is_empty() {
            return Err(KeyError::NoKeys);
        }
        let kek = self
            .keks
            .iter()
            .find(|k| k.id == kek_id)
            .ok_or_else(|| KeyError::UnknownKek(kek_id.to_owned()))?;
        let clear = open(&kek.key, &wrap_aad(namespace), wrapped, "data key")?;
        <[u8; KEY_BYTES]>::try_from(clear.as_slice()).map_err(|_| KeyError::DoesNotOpen("data key"))
    }
}

/// A secret version's value sealed by its namespace's data key, bound to
/// its namespace, name and version.
pub fn seal_value(
    data_key: &[u8; KEY_BYTES],
    place: &ValuePlace<'_>,
    value: &[u8],
) -> Result<Vec<u8>, KeyError> {
    seal(&aead_key(data_key), &place.aad(), value)
}

/// The value [`seal_value`] sealed at `place`.
pub fn open_value(
    data_key: &[u8; KEY_BYTES],
    place: &ValuePlace<'_>,
    sealed: &[u8],
) -> Result<Vec<u8>, KeyError> {
    open(&aead_key(data_key), &place.aad(), sealed, "secret value")
}

/// Where a sealed value belongs: what its associated data names.
#[derive(Debug, Clone, Copy)]
pub struct ValuePlace<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub version: i32,
}

impl ValuePlace<'_> {
    fn aad(&self) -> Vec<u8> {
        // lengths first, so no two places share a byte string
        format!(
            "composer-secret-v1:{}:{}:{}:{}:{}",
            self.namespace.len(),
            self.namespace,
            self.name.len(),
            self.name,
            self.version
        )
        .into_bytes()
    }
}

fn wrap_aad(namespace: &str) -> Vec<u8> {
    format!("composer-data-key-v1:{}:{namespace}", namespace.len()).into_bytes()
}

fn kek(key: &[u8; KEY_BYTES]) -> Kek {
    // the id is a fingerprint of the key under a label of its own: safe to
    // store beside what it wraps and to print
    let mut labelled = b"composer-kek-id-v1:".to_vec();
    labelled.extend_from_slice(key);
    let digest = digest::digest(&digest::SHA256, &labelled);
    let id = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Kek {
        id,
        key: aead_key(key),
    }
}

fn aead_key(key: &[u8; KEY_BYTES]) -> LessSafeKey {
    // AES_256_GCM takes exactly KEY_BYTES: the only error is a length
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).unwrap_or_else(|_| unreachable!()))
}

fn seal(key: &LessSafeKey, aad: &[u8], clear: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| KeyError::NoRandom)?;
    let mut sealed = clear.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut sealed,
    )
    .map_err(|_| KeyError::NoRandom)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&sealed);
    Ok(out)
}

fn open(
    key: &LessSafeKey,
    aad: &[u8],
    sealed: &[u8],
    what: &'static str,
) -> Result<Vec<u8>, KeyError> {
    if sealed.len() < NONCE_LEN {
        return Err(KeyError::DoesNotOpen(what));
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyError::DoesNotOpen(what))?;
    let mut body = body.to_vec();
    let clear = key
        .open_in_place(nonce, Aad::from(aad), &mut body)
        .map_err(|_| KeyError::DoesNotOpen(what))?;
    Ok(clear.to_vec())
}

/// A key file's text as a key.
pub fn parse_hex_key(text: &str) -> Result<[u8; KEY_BYTES], String> {
    let text = text.trim();
    if text.len() != KEY_BYTES * 2 {
        return Err(format!(
            "a key is {} hexadecimal digits ({KEY_BYTES} bytes), this is {} characters \
             (`composer secret new-key` makes one)",
            KEY_BYTES * 2,
            text.len()
        ));
    }
    let mut key = [0u8; KEY_BYTES];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16)
            .map_err(|_| "a key is hexadecimal digits only".to_owned())?;
    }
    Ok(key)
}

/// A new random key-encryption key as a key file's text.
pub fn new_hex_key() -> Result<String, KeyError> {
    let mut key = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| KeyError::NoRandom)?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_of(bytes: &[u8]) -> KeyRing {
        KeyRing::from_keys(&bytes.iter().map(|b| [*b; KEY_BYTES]).collect::<Vec<_>>())
    }

    #[test]
    fn a_value_opens_only_where_it_was_sealed() {
        let key = [7u8; KEY_BYTES];
        let here = ValuePlace {
            namespace: "a",
            name: "k",
            version: 1,
        };
        let sealed = seal_value(&key, &here, b"s3cret").expect("seal");
        assert!(!sealed.windows(6).any(|w| w == b"s3cret"));
        assert_eq!(open_value(&key, &here, &sealed).expect("open"), b"s3cret");
        for elsewhere in [
            ValuePlace {
                namespace: "b",
                ..here
            },
            ValuePlace { name: "j", ..here },
            ValuePlace { version: 2, ..here },
        ] {
            assert_eq!(
                open_value(&key, &elsewhere, &sealed),
                Err(KeyError::DoesNotOpen("secret value"))
            );
        }
        let mut altered = sealed.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert!(open_value(&key, &here, &altered).is_err());
        assert!(open_value(&[8u8; KEY_BYTES], &here, &sealed).is_err());
    }

    #[test]
    fn a_data_key_unwraps_with_any_key_given_and_wraps_with_the_first() {
        let old = ring_of(&[1]);
        let (data, old_id, wrapped) = old.new_data_key("ns").expect("new");
        let rotated = ring_of(&[2, 1]);
        assert_eq!(rotated.unwrap("ns", &old_id, &wrapped), Ok(data));
        let (new_id, rewrapped) = rotated.wrap("ns", &data).expect("wrap");
        assert_ne!(new_id, old_id);
        assert_eq!(ring_of(&[2]).unwrap("ns", &new_id, &rewrapped), Ok(data));
        assert_eq!(
            ring_of(&[1]).unwrap("ns", &new_id, &rewrapped),
            Err(KeyError::UnknownKek(new_id.clone()))
        );
        assert!(rotated.unwrap("other", &new_id, &rewrapped).is_err());
        assert_eq!(
            KeyRing::default().unwrap("ns", &new_id, &rewrapped),
            Err(KeyError::NoKeys)
        );
    }

    #[test]
    fn key_files_are_64_hex_digits() {
        let made = new_hex_key().expect("key");
        assert_eq!(parse_hex_key(&format!("{made}\n")).map(|_| ()), Ok(()));
        assert!(parse_hex_key("abc").is_err());
        assert!(parse_hex_key(&"zz".repeat(32)).is_err());
        assert_ne!(made, new_hex_key().expect("another"));
    }
}
