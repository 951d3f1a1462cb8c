//! Generates the gRPC code from `proto/`. protoc comes from the `protoc-bin-vendored` crate, so a fresh
//! machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    // Read when the script runs, not baked in when it was compiled: a build script binary may be reused
    // for a copy of the repository elsewhere (a worktree sharing the target directory).
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let protos = [root.join("holdfast/v1/locks.proto")];
    // Small per-call buffers: a session stream keeps its two for the session's life (src/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::codec::LeanCodec")
        .compile_protos(&protos, std::slice::from_ref(&root))?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
