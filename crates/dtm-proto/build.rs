//! Generates the messages, the server trait and the client of `proto/dtmgimp.proto`. The
//! proto is compiled by protox (Rust) rather than protoc, so nothing outside cargo is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/dtmgimp.proto");
    let files = protox::compile(["proto/dtmgimp.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(files)?;
    Ok(())
}
