//! Generates the example gRPC participant's server and client (`proto/busi.proto`), compiled by protox
//! (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/busi.proto");
    let files = protox::compile(["proto/busi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(files)?;
    Ok(())
}
