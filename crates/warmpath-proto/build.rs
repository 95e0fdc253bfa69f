//! Compiles `proto/warmpath/v1/*.proto` with protox (pure Rust; no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("warmpath/v1/cache_events.proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile([&file], [&root])?;
    tonic_prost_build::configure()
        // Relayed decisions: one buffer shared by every router they go to.
        .bytes(".warmpath.v1.AgentMessage.decision")
        .bytes(".warmpath.v1.RouterMessage.decision")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
