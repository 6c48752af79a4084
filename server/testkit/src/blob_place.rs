//! Where a test's blobs go: a temporary folder, or a bucket of a real S3
//! API (moto), as a server's flags and as a store the test can look into.

use composer_blobs::BlobStore;

use crate::moto::Moto;

/// A blob store's location and settings, kept (the folder, the moto
/// server) for as long as the value lives.
pub struct BlobPlace {
    /// `--blob-store`'s value.
    pub location: String,
    /// `--blob-store-option`s, as object_store names them.
    pub options: Vec<(String, String)>,
    _folder: Option<tempfile::TempDir>,
    _moto: Option<Moto>,
}

impl BlobPlace {
    /// A temporary folder, removed when the value is dropped.
    pub fn folder() -> Self {
        let folder = tempfile::tempdir().expect("a temporary folder");
        Self {
            location: folder.path().to_string_lossy().into_owned(),
            options: Vec::new(),
            _folder: Some(folder),
            _moto: None,
        }
    }

    /// A bucket of a moto server of its own.
    pub async fn bucket(name: &str) -> Self {
        let moto = Moto::start(name).await;
        Self {
            location: moto.location(),
            options: moto.options(),
            _folder: None,
            _moto: Some(moto),
        }
    }

    /// The place opened as a store.
    pub fn open(&self) -> BlobStore {
        BlobStore::open(&self.location, &self.options).expect("open the blob store")
    }

    /// The server flags that put its blobs here.
    pub fn server_args(&self) -> Vec<String> {
        let mut args = vec!["--blob-store".to_owned(), self.location.clone()];
        for (key, value) in &self.options {
            args.extend(["--blob-store-option".to_owned(), format!("{key}={value}")]);
        }
        args
    }
}
