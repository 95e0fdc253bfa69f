//! `warmpath-agent`: a thin shell over [`warmpath_agent::Agent`].

use anyhow::Context;
use clap::Parser;
use metrics_exporter_prometheus::PrometheusBuilder;
use warmpath_agent::cli::Cli;
use warmpath_agent::Agent;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Some(why) = warmpath_agent::cli::removed_flag(std::env::args_os()) {
        anyhow::bail!(why);
    }
    let cli = Cli::parse();
    warmpath_proto::logging::init_logging(cli.log_format, &[]);
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let config = cli.into_config().context("reading the command line")?;
    let agent = Agent::start(config, Some(prometheus))
        .await
        .context("starting the agent")?;
    // Scripts read the bound address from stdout.
    println!("warmpath-agent listening on http://{}", agent.http_addr());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    tracing::info!("shutting down");
    agent.shutdown().await;
    Ok(())
}
