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

/// Giving freed memory back: mimalloc returns free pages to the OS only
/// lazily, from later allocations of the thread that owns them, and a quiet
/// router makes none, so a cleared worker's index stayed resident. The
/// ingest calls [`release_memory`] once the index freed a lot
/// (`ingest::set_memory_release`); it collects this thread's pages, and every
/// other thread collects its own once: a runtime worker when it next parks,
/// a blocking thread at the end of its next ingest job or when it exits.
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
    // No transparent huge pages (mimalloc's `no_thp` feature leaves its
    // arenas un-advised; this covers hosts with THP "always"): the kernel
    // kept, and khugepaged rebuilt, a whole 2 MiB page for a few live bytes,
    // so freed index memory never came back (RSS even rose while idle, 57
    // -> 67 MiB after a clear). The index's random lookups lose a few TLB
    // hits, far below the routing cost.
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
    warmpath_proto::logging::init_logging_quiet(cli.log_format, &[warmpath_router::ACCESS_TARGET]);
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
