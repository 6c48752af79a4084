//! Compiles `api/composer/v1/*.proto` with protox (pure Rust, so no `protoc`
//! binary is needed) and generates prost messages and tonic services. The
//! encoded descriptor set, with comments, is kept for server reflection.

use std::{env, fs, io, path::PathBuf};

fn main() -> io::Result<()> {
    let api_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../api");
    let proto_dir = api_root.join("composer/v1");
    let mut protos: Vec<PathBuf> = fs::read_dir(&proto_dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    protos.sort();

    let mut compiler = protox::Compiler::new([&api_root]).map_err(io::Error::other)?;
    compiler.include_source_info(true).include_imports(true);
    for proto in &protos {
        let relative = proto.strip_prefix(&api_root).map_err(io::Error::other)?;
        compiler.open_file(relative).map_err(io::Error::other)?;
        println!("cargo:rerun-if-changed={}", proto.display());
    }
    println!("cargo:rerun-if-changed={}", proto_dir.display());

    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(io::Error::other)?);
    fs::write(
        out_dir.join("composer_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .generate_default_stubs(true)
        // blob chunks as `Bytes`: decoded and sent without a copy each way
        .bytes(".composer.v1.UploadBlobRequest.data")
        .bytes(".composer.v1.DownloadBlobResponse.data")
        .compile_fds(compiler.file_descriptor_set())
}
