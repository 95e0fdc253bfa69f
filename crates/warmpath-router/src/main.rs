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

/// Giving freed memory back: mimalloc returns free pages only lazily, from
/// later allocations of their thread, and a quiet router makes none. The
/// ingest calls [`release_memory`] once the index freed a lot; every other
/// thread collects its own pages once, when it next parks or ends a job.
#[cfg(feature = "mimalloc")]
mod release {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    static ASKED: AtomicU64 = AtomicU64::new(0);
    thread_local!(static DONE: Cell<u64> = const { Cell::new(0) });

    #[allow(unsafe_code)]
    fn collect() {
        // SAFETY: mi_collect has no preconditions; it frees only pages that
        // hold no live allocation.
        unsafe { libmimalloc_sys::mi_collect(true) }
    }

    pub(crate) fn release_memory() {
        DONE.set(ASKED.fetch_add(1, Ordering::Relaxed) + 1);
        collect();
    }

    /// Collect once per request on this thread.
    pub(crate) fn catch_up() {
        let asked = ASKED.load(Ordering::Relaxed);
        if DONE.get() != asked {
            DONE.set(asked);
            collect();
        }
    }
}

fn main() -> anyhow::Result<()> {
    // No transparent huge pages (for hosts with THP "always"): a whole 2 MiB
    // page kept for a few live bytes meant freed index memory never came back.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    #[cfg(feature = "mimalloc")]
    {
        warmpath_router::ingest::set_memory_release(release::release_memory, release::catch_up);
        runtime.on_thread_park(release::catch_up);
        runtime.on_thread_stop(release::catch_up);
    }
    runtime
        .build()
        .context("starting the async runtime")?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Access lines only when RUST_LOG names their target.
    warmpath_proto::logging::init_logging(cli.log_format, &[warmpath_router::ACCESS_TARGET]);
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
