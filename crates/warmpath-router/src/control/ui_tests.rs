use super::*;
use serde_json::json;

#[test]
fn the_page_has_one_slot_and_fetches_nothing_from_elsewhere() {
    assert_eq!(PAGE.matches(SLOT).count(), 1);
    for outside in ["http://", "https://", "//cdn", "src=\"http"] {
        assert!(!PAGE.contains(outside), "{outside}");
    }
}

#[test]
fn an_embedded_snapshot_cannot_close_its_script() {
    let v = json!({"pools": [{"model": "</script><script>alert(1)</script>"}]});
    let html = render(&v);
    assert_eq!(
        html.matches("</script>").count(),
        PAGE.matches("</script>").count()
    );
    let start = html.find(r#"type="application/json">"#).unwrap() + 24;
    let end = start + html[start..].find("</script>").unwrap();
    let back: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    assert_eq!(back, v);
}
