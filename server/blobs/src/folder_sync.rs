//! Folder syncs shared by the writes waiting on them. A blob renamed into
//! its folder is durable once the folder is synced after the rename, so one
//! sync covers every rename made before it started: under load the blobs
//! of a namespace, which share a folder, share their folder's syncs as
//! events share a commit.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

/// Every folder's sync state.
#[derive(Default)]
pub(crate) struct FolderSyncs {
    folders: Mutex<HashMap<PathBuf, Arc<FolderSync>>>,
}

#[derive(Default)]
struct FolderSync {
    /// Renames into the folder so far.
    renamed: AtomicU64,
    /// Renames the last sync covered; held while syncing.
    synced: Mutex<u64>,
}

impl FolderSyncs {
    /// Makes a rename into `folder`, done before this call, durable: by a
    /// sync of its own, or by one that started after the rename. Blocks.
    pub(crate) fn sync_after_rename(&self, folder: &Path) -> std::io::Result<()> {
        let state = {
            let mut folders = self.folders.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(folders.entry(folder.to_path_buf()).or_default())
        };
        let ticket = state.renamed.fetch_add(1, Ordering::SeqCst) + 1;
        let mut synced = state.synced.lock().unwrap_or_else(|e| e.into_inner());
        if *synced >= ticket {
            return Ok(());
        }
        // every rename counted by now happened before this sync starts
        let covered = state.renamed.load(Ordering::SeqCst);
        std::fs::File::open(folder)?.sync_all()?;
        *synced = covered;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_covers_the_renames_made_before_it_and_not_those_after() {
        let folder = tempfile::tempdir().expect("folder");
        let syncs = FolderSyncs::default();
        syncs.sync_after_rename(folder.path()).expect("sync");
        let state = Arc::clone(&syncs.folders.lock().unwrap()[folder.path()]);
        assert_eq!(*state.synced.lock().unwrap(), 1);
        // a rename counted while no sync runs: the next caller syncs again
        state.renamed.fetch_add(1, Ordering::SeqCst);
        syncs.sync_after_rename(folder.path()).expect("sync");
        assert_eq!(*state.synced.lock().unwrap(), 3);
        // a rename a sync already covered (it started after the rename):
        // nothing to do, even with the folder gone
        *state.synced.lock().unwrap() = 5;
        state.renamed.fetch_add(1, Ordering::SeqCst);
        drop(folder);
        syncs
            .sync_after_rename(&state_path(&syncs))
            .expect("covered: no sync");
    }

    fn state_path(syncs: &FolderSyncs) -> PathBuf {
        syncs.folders.lock().unwrap().keys().next().unwrap().clone()
    }

    #[test]
    fn a_folder_that_is_gone_is_an_error_and_a_later_sync_tries_again() {
        let folder = tempfile::tempdir().expect("folder");
        let gone = folder.path().join("gone");
        let syncs = FolderSyncs::default();
        assert!(syncs.sync_after_rename(&gone).is_err());
        std::fs::create_dir(&gone).expect("mkdir");
        syncs.sync_after_rename(&gone).expect("sync");
        let state = Arc::clone(&syncs.folders.lock().unwrap()[gone.as_path()]);
        assert_eq!(*state.synced.lock().unwrap(), 2);
    }
}
