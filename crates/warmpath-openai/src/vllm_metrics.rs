//! `/metrics` in vLLM's names, which the agent scrapes (`vllm:*`).

use std::fmt::Write as _;

/// What a backend reports, in vLLM's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct VllmStats {
    /// Requests prefilling or decoding.
    pub running: u64,
    pub waiting: u64,
    /// Cache usage, 0..=1.
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of those, cached.
    pub prefix_hits: u64,
    /// Prompt tokens, output tokens and finished requests, where the backend
    /// counts them.
    pub totals: Option<Totals>,
}

/// The throughput counters (`vllm:prompt_tokens_total` and the like).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests: u64,
}

/// vLLM's gauges and prefix-cache counters: name, type, help.
const GAUGES: [(&str, &str, &str); 5] = [
    (
        "num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
    ),
    (
        "num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
    ),
    (
        "kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
    ),
    (
        "prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in tokens.",
    ),
    (
        "prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in tokens.",
    ),
];

/// The metrics of [`Totals`], in its order.
const TOTALS: [(&str, &str, &str); 3] = [
    (
        "prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
    ),
    (
        "generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
    ),
    (
        "request_success_total",
        "counter",
        "Count of successfully processed requests.",
    ),
];

/// Renders the Prometheus text for `model`.
pub fn render(model: &str, block_size: usize, cache_blocks: usize, s: &VllmStats) -> String {
    let ml = format!(
        "model_name=\"{}\"",
        model.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut out = String::new();
    let mut put = |(name, kind, help): (&str, &str, &str), labels: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP vllm:{name} {help}\n# TYPE vllm:{name} {kind}\nvllm:{name}{{{labels}}} {value}"
        );
    };
    let values = [
        s.running.to_string(),
        s.waiting.to_string(),
        s.kv_usage.to_string(),
        s.prefix_queries.to_string(),
        s.prefix_hits.to_string(),
    ];
    for (meta, value) in GAUGES.into_iter().zip(values) {
        put(meta, &ml, value);
    }
    if let Some(t) = s.totals {
        let finished = format!("{ml},finished_reason=\"length\"");
        let rows = [
            (&ml, t.prompt_tokens),
            (&ml, t.generation_tokens),
            (&finished, t.requests),
        ];
        for (meta, (labels, value)) in TOTALS.into_iter().zip(rows) {
            put(meta, labels, value.to_string());
        }
    }
    let info = format!(
        "block_size=\"{block_size}\",num_gpu_blocks=\"{cache_blocks}\",enable_prefix_caching=\"True\",cache_dtype=\"auto\""
    );
    let meta = (
        "cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig.",
    );
    put(meta, &info, "1.0".into());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_vllms() {
        let s = VllmStats {
            running: 2,
            prefix_hits: 7,
            totals: Some(Totals::default()),
            ..VllmStats::default()
        };
        let text = render("m\"x", 16, 64, &s);
        assert!(text.contains("vllm:num_requests_running{model_name=\"m\\\"x\"} 2\n"));
        assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"m\\\"x\"} 7\n"));
        assert!(text.contains("vllm:request_success_total{"));
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"64\","));
        let bare = render("m", 16, 64, &VllmStats::default());
        assert!(!bare.contains("prompt_tokens_total"));
    }
}
