//! The HELP text of every metric series the agent writes, registered once
//! with the recorder (`promtool check metrics` wants HELP on each).

use metrics::{describe_counter, describe_gauge};

/// Counters, one a line: the name, a space, the HELP text.
const COUNTERS: &str = "\
warmpath_agent_batches_total KV-event batches applied, by engine rank
warmpath_agent_bad_messages_total Engine messages skipped as malformed, by reason
warmpath_agent_block_size_mismatch_total Batches whose block size disagreed with another rank's
warmpath_agent_engine_restarts_total Engine restarts seen (sequence back to 0, or a new process in its metrics)
warmpath_agent_event_reconnects_total Times an engine event socket reconnected to a publisher it had lost
warmpath_agent_seq_gaps_total Sequence gaps in the engine's events
warmpath_agent_seq_gaps_unrecovered_total Gaps the replay could not fill (routers then get a fresh snapshot)
warmpath_agent_replays_total Replay requests to the engine, by result
warmpath_agent_unknown_parent_total Stored blocks whose parent block was unknown
warmpath_agent_blocks_refused_total New blocks refused because a rank's tracker holds its most (4,194,304)
warmpath_agent_unresolved_offload_total Offload events naming blocks the agent does not know
warmpath_agent_load_scrape_errors_total Failed scrapes of the engine's metrics page
warmpath_agent_deltas_sent_total Deltas sent to routers
warmpath_agent_deltas_coalesced_total Deltas merged in a slow router's queue, by router
warmpath_agent_snapshots_sent_total Snapshots sent to routers
warmpath_agent_snapshot_requests_deferred_total Snapshot requests a router made within 1 s of the last one it was sent (coalesced into one, sent when the second is up), by router
warmpath_agent_router_reconnects_total Router stream reconnects, by router
warmpath_agent_router_refused_total Streams a router refused, by router
warmpath_agent_router_tls_failures_total TLS failures toward a router, by router
warmpath_agent_router_dns_failures_total Failed lookups of a dns:// router name, by name
warmpath_agent_http_refused_total Connections to the agent's HTTP server answered 503 and closed because its connection cap was reached
warmpath_agent_http_timeouts_total Agent HTTP connections closed because their request was not in and answered within the deadline (reason header)
warmpath_agent_decisions_shared_total Routing decisions a router sent for this worker, passed on to every other router this agent streams to
warmpath_agent_decisions_dropped_total Shared routing decisions dropped because a router's queue was full (the oldest goes)";

/// Gauges, as [`COUNTERS`].
const GAUGES: &str = "\
warmpath_agent_blocks Blocks the agent reports for its worker
warmpath_agent_engine_running Requests the engine is running (its last good scrape)
warmpath_agent_engine_waiting Requests waiting in the engine (its last good scrape)
warmpath_agent_engine_kv_usage The engine's KV-cache usage, 0..1 (its last good scrape)
warmpath_agent_router_connected 1 while the stream to a router is up, by router
warmpath_agent_ready 1 when GET /readyz answers 200 (engine reachable, a router stream up, KV events flowing), else 0
warmpath_agent_engine_up 1 when the engine's metrics page answered the latest scrape, else 0
warmpath_agent_router_streams Router streams currently up
warmpath_agent_kv_events_silent 1 when the engine served prompt tokens but no KV event arrived for --events-silence-ms
warmpath_agent_router_replicas Router replicas a dns:// router name resolves to, by name
warmpath_build_info Always 1; the labels name the running build";

/// Registers every series' HELP text (with the recorder installed).
pub(crate) fn describe() {
    metrics::gauge!("warmpath_build_info", "binary" => "warmpath-agent", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    for (name, help) in COUNTERS.lines().filter_map(|l| l.split_once(' ')) {
        describe_counter!(name, help);
    }
    for (name, help) in GAUGES.lines().filter_map(|l| l.split_once(' ')) {
        describe_gauge!(name, help);
    }
}
