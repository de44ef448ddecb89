//! Generates the client API and the Raft transport from `proto/`, with the protoc that the `protoc-bin-vendored`
//! crate ships, so a fresh machine needs no protobuf compiler installed; and the client API's messages in the protobuf
//! JSON mapping (pbjson), with the field names of the `.proto` files, every field written.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out_dir.join("cellog_descriptor.bin");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_build::configure()
        .btree_map(["."])
        .bytes(["."])
        .file_descriptor_set_path(&descriptors)
        .compile_protos_with_config(
            config,
            &["proto/cellog/v1/cellog.proto", "proto/cellog/raft/v1/raft.proto"],
            &["proto"],
        )?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .btree_map(["."])
        .preserve_proto_field_names()
        .emit_fields()
        .build(&[".cellog.v1"])?;
    Ok(())
}
