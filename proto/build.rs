//! Generates the client API and the Raft transport from `proto/`, with the protoc that the `protoc-bin-vendored`
//! crate ships, so a fresh machine needs no protobuf compiler installed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_build::configure()
        .btree_map(["."])
        .bytes(["."])
        .file_descriptor_set_path(out_dir.join("cellog_descriptor.bin"))
        .compile_protos_with_config(
            config,
            &["proto/cellog/v1/cellog.proto", "proto/cellog/raft/v1/raft.proto"],
            &["proto"],
        )?;
    Ok(())
}
