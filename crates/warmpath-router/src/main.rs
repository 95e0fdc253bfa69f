//! The `warmpath-router` binary: parse flags, start the library, handle signals.

use anyhow::Context;
use clap::Parser;
use std::io::Write;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use warmpath_router::Cli;

// mimalloc gives freed memory back to the OS (after a short delay): with
// glibc's malloc a few giant requests left hundreds of MB resident for good.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    warmpath_proto::logging::init_logging(cli.log_format);
    let config = cli.load().context("loading the configuration")?;
    if cli.check_config {
        config.validate().context("checking the configuration")?;
        println!("configuration OK: {} pool(s)", config.pools.len());
        return Ok(());
    }
    if let Some(worker) = &cli.print_agent_token {
        let secret = config.agent_secret.as_deref().context(
            "--print-agent-token needs the agent secret (--agent-secret, WARMPATH_AGENT_SECRET or agent_secret in --config)",
        )?;
        println!("{}", warmpath_proto::worker_token(secret, worker));
        return Ok(());
    }
    let grpc_scheme = if config.ingest.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let shutdown = CancellationToken::new();
    let running = warmpath_router::start(config, shutdown.clone())
        .await
        .context("starting the router")?;
    // Handlers first: a SIGHUP right after the address is printed must not
    // hit the default action (terminate).
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{}", running.http_addr)?;
        if let Some(g) = running.grpc_addr {
            writeln!(out, "grpc listening on {grpc_scheme}://{g}")?;
        }
        out.flush()?;
    }
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = hup.recv() => {
                let reloaded = match cli.load() {
                    Ok(c) => running.reload(&c).await,
                    Err(e) => Err(e.into()),
                };
                match reloaded {
                    Ok(changes) if changes.is_empty() => tracing::info!("SIGHUP: configuration unchanged"),
                    Ok(changes) => tracing::info!(changes = changes.len(), "SIGHUP: configuration reloaded"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: reload refused; keeping the running configuration"),
                }
            }
        }
    }
    tracing::info!("shutting down");
    shutdown.cancel();
    running.wait().await;
    Ok(())
}
