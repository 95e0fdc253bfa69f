//! `GET /v1/models`: the engines' own model cards (kept by the health probes),
//! merged per pool (docs/router-internals.md).

use crate::control::state::Shared;
use crate::routing::pool::Pool;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A card the router makes up for `id` (no engine described it).
fn own_card(id: &str, parent: Option<&str>) -> Value {
    let mut card = json!({"id": id, "object": "model", "created": 0, "owned_by": "warmpath"});
    if let Some(p) = parent {
        card["parent"] = json!(p);
        card["root"] = json!(id);
    }
    card
}

/// Pool `p`'s cards: its model's first, then its adapters' by id.
pub(crate) fn pool_cards(p: &Pool) -> Vec<Value> {
    let members = p.backends();
    let mut backends: Vec<_> = members.iter().collect();
    // Stable: healthy first, in configuration order.
    backends.sort_by_key(|b| !b.health.is_healthy());
    let mut base: Option<Value> = None;
    let mut min_len: Option<u64> = None;
    let mut adapters: BTreeMap<String, Value> = BTreeMap::new();
    for b in &backends {
        for card in b.endpoint.learned_cards() {
            let Some(id) = card.get("id").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            if id == p.model {
                if let Some(n) = card.get("max_model_len").and_then(Value::as_u64) {
                    min_len = Some(min_len.map_or(n, |m| m.min(n)));
                }
                base.get_or_insert(card);
            } else {
                adapters.entry(id).or_insert(card);
            }
        }
    }
    for b in &backends {
        for a in b.endpoint.adapters() {
            let card = || own_card(&a, Some(&p.model));
            adapters.entry(a.clone()).or_insert_with(card);
        }
    }
    let mut base = base.unwrap_or_else(|| own_card(&p.model, None));
    if let Some(n) = min_len {
        base["max_model_len"] = json!(n);
    }
    let mut out = vec![base];
    out.extend(adapters.into_values());
    out
}

/// `GET /v1/models`: every pool's cards.
pub(crate) async fn models(State(s): State<Arc<Shared>>) -> Json<Value> {
    let data: Vec<Value> = s.pools.all.iter().flat_map(|p| pool_cards(p)).collect();
    Json(json!({"object": "list", "data": data}))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn own_cards_name_their_parent() {
        assert_eq!(own_card("m", None).get("parent"), None);
        let c = own_card("a", Some("m"));
        assert_eq!(c["parent"], "m");
        assert_eq!(c["owned_by"], "warmpath");
    }
}
