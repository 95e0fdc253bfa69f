use super::*;

#[test]
fn cards_of_keeps_the_model_and_its_adapters_whole() {
    let body = br#"{"object":"list","data":[
        {"id":"m","object":"model","root":"/models/m","parent":null,"max_model_len":4096},
        {"id":"sql","object":"model","root":"/lora/sql","parent":"m"},
        {"id":"other","parent":null},
        {"id":"","parent":"m"}]}"#;
    let cards = cards_of(body, "m").unwrap();
    assert_eq!(cards.len(), 2);
    assert_eq!(cards[0]["root"], "/models/m");
    assert_eq!(cards[0]["max_model_len"], 4096);
    assert_eq!(cards[1]["root"], "/lora/sql");
    assert_eq!(cards_of(b"[]", "m"), None);
    assert_eq!(cards_of(b"{", "m"), None);
}

#[test]
fn adapters_are_the_cards_parented_by_the_model() {
    let body = br#"{"object":"list","data":[
        {"id":"m","object":"model","parent":null},
        {"id":"sql","object":"model","parent":"m"},
        {"id":"other","object":"model","parent":"x"}]}"#;
    let a = adapters_of(&cards_of(body, "m").unwrap(), "m");
    assert_eq!(a.into_iter().collect::<Vec<_>>(), ["sql"]);
    assert!(cards_of(b"not json", "m").is_none());
}

#[test]
fn the_context_length_is_the_models_own_card() {
    let body = br#"{"data":[{"id":"sql","max_model_len":99,"parent":"m"},
        {"id":"m","max_model_len":4096}]}"#;
    let len = |body: &[u8]| max_model_len_of(&cards_of(body, "m").unwrap(), "m");
    assert_eq!(len(body), Some(4096));
    assert_eq!(len(br#"{"data":[{"id":"m"}]}"#), None);
    assert_eq!(len(br#"{"data":[{"id":"m","max_model_len":0}]}"#), None);
}

#[test]
fn the_completion_probe_asks_one_token_of_the_pool_model() {
    let v: Value = serde_json::from_slice(&completion_probe("m")).unwrap();
    assert_eq!(
        (v["model"].as_str(), v["max_tokens"].as_u64()),
        (Some("m"), Some(1))
    );
}
