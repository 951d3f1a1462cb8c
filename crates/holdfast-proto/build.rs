//! Generates the gRPC code from `proto/`. protoc comes from the `protoc-bin-vendored` crate, so a fresh
//! machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let protos = [root.join("holdfast/v1/peer.proto"), root.join("holdfast/v1/locks.proto")];
    tonic_prost_build::configure().compile_protos(&protos, std::slice::from_ref(&root))?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
