//! The secret store of each namespace (decision 0044): values sealed under
//! the namespace's data key, itself wrapped by the operator's
//! key-encryption keys. Values go in through SetSecret and out only into
//! an executing node's request ([`Coordinator::secret_values`]); no call
//! returns one.

pub mod keys;
pub mod values;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use composer_store::secrets::{self, SecretRow, WrappedKey};

use crate::{Coordinator, CoordinatorError};

pub use keys::{KeyError, KeyRing};
pub use values::SecretValues;

/// Largest secret value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Secrets (names) one namespace may hold.
pub const MAX_SECRETS_PER_NAMESPACE: i64 = 1_000;

/// The keys a server holds: its key-encryption keys and the data keys it
/// unwrapped (a data key never changes; a rewrap only wraps it anew).
#[derive(Debug, Default)]
pub struct SecretKeys {
    ring: KeyRing,
    data_keys: Mutex<HashMap<String, [u8; keys::KEY_BYTES]>>,
}

impl SecretKeys {
    /// The keys of a server given `ring`.
    pub fn new(ring: KeyRing) -> Arc<SecretKeys> {
        Arc::new(SecretKeys {
            ring,
            data_keys: Mutex::default(),
        })
    }

    fn cached(&self, namespace: &str) -> Option<[u8; keys::KEY_BYTES]> {
        self.data_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(namespace)
            .copied()
    }

    fn remember(&self, namespace: &str, key: [u8; keys::KEY_BYTES]) {
        self.data_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(namespace.to_owned(), key);
    }
}

impl Coordinator {
    /// Stores a new version of a secret and returns it as listed.
    pub async fn set_secret(
        &self,
        namespace: &str,
        name: &str,
        value: &[u8],
        actor: &str,
    ) -> Result<SecretRow, CoordinatorError> {
        let data_key = self.data_key(namespace, true).await?;
        let mut tx = self.store().begin().await?;
        let (version, is_new) = secrets::next_version(&mut tx, namespace, name).await?;
        if is_new && secrets::count(&mut tx, namespace).await? >= MAX_SECRETS_PER_NAMESPACE {
            return Err(CoordinatorError::SecretQuota {
                limit: MAX_SECRETS_PER_NAMESPACE,
            });
        }
        let place = keys::ValuePlace {
            namespace,
            name,
            version,
        };
        let sealed = keys::seal_value(&data_key, &place, value)?;
        secrets::insert_version(&mut tx, namespace, name, version, &sealed, actor).await?;
        let listed = secrets::listed_one(&mut tx, namespace, name).await?;
        tx.commit().await?;
        listed.ok_or_else(|| CoordinatorError::SecretNotFound(name.to_owned()))
    }

    /// One page of the namespace's secrets, names after `after`.
    pub async fn list_secrets(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<SecretRow>, CoordinatorError> {
        self.secret_keys().ring.wrapping_id()?;
        Ok(secrets::list(self.store().pool(), namespace, after, limit).await?)
    }

    /// Deletes a secret and its versions.
    pub async fn delete_secret(&self, namespace: &str, name: &str) -> Result<(), CoordinatorError> {
        self.secret_keys().ring.wrapping_id()?;
        if secrets::delete(self.store().pool(), namespace, name).await? {
            Ok(())
        } else {
            Err(CoordinatorError::SecretNotFound(name.to_owned()))
        }
    }

    /// Wraps the namespace's data key again under the first key-encryption
    /// key: how many were (0 or 1), and that key's id.
    pub async fn rewrap_secret_keys(
        &self,
        namespace: &str,
    ) -> Result<(usize, String), CoordinatorError> {
        let ring = &self.secret_keys().ring;
        let wrapping = ring.wrapping_id()?.to_owned();
        let Some(old) = secrets::data_key(self.store().pool(), namespace).await? else {
            return Ok((0, wrapping));
        };
        if old.kek_id == wrapping {
            return Ok((0, wrapping));
        }
        let data_key = ring.unwrap(&old.namespace, &old.kek_id, &old.wrapped)?;
        let (id, wrapped) = ring.wrap(&old.namespace, &data_key)?;
        let rewrapped = secrets::rewrap(self.store().pool(), &old, &id, &wrapped).await?;
        Ok((usize::from(rewrapped), wrapping))
    }

    /// The current values of `names` in `namespace`, for one execution.
    pub async fn secret_values(
        &self,
        namespace: &str,
        names: &[String],
    ) -> Result<SecretValues, CoordinatorError> {
        let mut held = SecretValues::default();
        if names.is_empty() {
            return Ok(held);
        }
        let data_key = self.data_key(namespace, false).await?;
        for name in names {
            let (version, sealed) = secrets::newest(self.store().pool(), namespace, name)
                .await?
                .ok_or_else(|| CoordinatorError::SecretNotFound(name.clone()))?;
            let place = keys::ValuePlace {
                namespace,
                name,
                version,
            };
            let value = keys::open_value(&data_key, &place, &sealed)?;
            let text = String::from_utf8(value)
                .map_err(|_| CoordinatorError::SecretNotText { name: name.clone() })?;
            held.insert(name, text);
        }
        Ok(held)
    }

    /// The namespace's data key: cached, or unwrapped from the store, or
    /// (with `create`) made now.
    async fn data_key(
        &self,
        namespace: &str,
        create: bool,
    ) -> Result<[u8; keys::KEY_BYTES], CoordinatorError> {
        let held = self.secret_keys();
        held.ring.wrapping_id()?;
        if let Some(key) = held.cached(namespace) {
            return Ok(key);
        }
        let stored = match secrets::data_key(self.store().pool(), namespace).await? {
            Some(stored) => stored,
            None if create => {
                let (_, kek_id, wrapped) = held.ring.new_data_key(namespace)?;
                let new = WrappedKey {
                    namespace: namespace.to_owned(),
                    kek_id,
                    wrapped,
                };
                // another server may have made one first: use the stored
                secrets::insert_data_key(self.store().pool(), &new).await?
            }
            None => return Err(CoordinatorError::NoDataKey),
        };
        let key = held
            .ring
            .unwrap(&stored.namespace, &stored.kek_id, &stored.wrapped)?;
        held.remember(namespace, key);
        Ok(key)
    }
}
