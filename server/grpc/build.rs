//! Release builds embed `dashboard/dist` (rust-embed, `src/dashboard.rs`),
//! which cargo cannot see in the sources: without this, a dashboard built
//! after the server's last release build would never be embedded. Debug
//! builds read the folder at run time and need no rebuild.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_CFG_DEBUG_ASSERTIONS").is_some() {
        return;
    }
    let Some(manifest) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let repo = Path::new(&manifest).join("../..");
    // the built files when they exist, else the dashboard's sources (where
    // `npm run build` creates them); cargo scans a folder recursively
    for folder in ["dashboard/dist", "dashboard"] {
        let path = repo.join(folder);
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            return;
        }
    }
}
