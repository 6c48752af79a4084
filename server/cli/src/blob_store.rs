//! Where the server keeps large payloads (`--blob-store`, decision 0047).

use composer_blobs::BlobStore;
use composer_coordinator::payloads::Payloads;

use crate::config::ServerArgs;

/// Bytes of blob values kept for expressions to read again.
const BLOB_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Opens the blob store the settings name, or the default folder of the
/// database `database_url` names; the error says why, for the start's.
pub fn open(server: &ServerArgs, database_url: &str) -> Result<Payloads, String> {
    let location = match &server.blob_store {
        Some(location) => location.clone(),
        None => default_location(database_url),
    };
    let store =
        BlobStore::open(&location, &server.blob_store_options).map_err(|e| e.to_string())?;
    tracing::info!(%location, "blob store");
    Ok(Payloads::new(store, BLOB_CACHE_BYTES)
        .with_url_ttl(std::time::Duration::from_secs(server.blob_url_secs)))
}

/// A folder of the database's own under the user's data folder: servers of
/// two databases on one machine never share blobs (each collector deletes
/// what its own database no longer refers to).
fn default_location(database_url: &str) -> String {
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".local/share"))
        })
        .unwrap_or_else(|| std::path::PathBuf::from("."));
    data_home
        .join("composer")
        .join("blobs")
        .join(database_folder(database_url))
        .to_string_lossy()
        .into_owned()
}

/// The database's host, port and name as one folder name (no credentials).
fn database_folder(database_url: &str) -> String {
    let Ok(url) = url::Url::parse(database_url) else {
        return "default".to_owned();
    };
    let name = format!(
        "{}_{}_{}",
        url.host_str().unwrap_or("local"),
        url.port().unwrap_or(5432),
        url.path().trim_start_matches('/')
    );
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_database_has_a_folder_of_its_own_named_without_credentials() {
        assert_eq!(
            database_folder("postgres://composer:secret@127.0.0.1:5433/composer_a"),
            "127.0.0.1_5433_composer_a"
        );
        assert_ne!(
            database_folder("postgres://u@h/a"),
            database_folder("postgres://u@h/b")
        );
    }
}
