// The migrations are embedded by `sqlx::migrate!`; rebuild when one is added
// or changed, not only when the crate's sources change.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
