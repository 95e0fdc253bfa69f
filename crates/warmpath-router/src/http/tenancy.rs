//! A request's tenant under its pool's `tenants:` settings (docs/tenants.md):
//! the client's id as sent, or derived from its API key.

use crate::config::{ClientIds, TenantFrom, TenantsConfig};
use crate::control::access::presented;
use crate::http::error::ApiError;
use axum::http::HeaderMap;
use warmpath_core::TenantId;

/// The tenant of a request whose validated client-sent id is `client`.
pub(crate) fn resolve(
    cfg: &TenantsConfig,
    headers: &HeaderMap,
    client: Option<TenantId>,
) -> Result<Option<TenantId>, ApiError> {
    if cfg.from == TenantFrom::Header {
        return Ok(client);
    }
    let key = presented(headers)
        .filter(|k| !k.is_empty())
        .ok_or_else(ApiError::unauthorized)?;
    let own = TenantId::from_api_key(key);
    match (client, cfg.client_ids) {
        (None, _) => Ok(Some(own)),
        (Some(c), ClientIds::Scope) => Ok(Some(own.scoped(&c))),
        (Some(_), ClientIds::Refuse) => Err(ApiError::forbidden(
            "tenant_id_not_allowed",
            "this pool derives the tenant from the API key: do not send \
             X-Prefix-Aware-Id, prompt_cache_key or cache_salt",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderValue, StatusCode};
    use warmpath_core::TenantSource;

    fn with_key(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let v = HeaderValue::from_str(&format!("Bearer {key}")).unwrap();
        h.insert(header::AUTHORIZATION, v);
        h
    }

    fn id(s: &str) -> Option<TenantId> {
        Some(TenantId::parse(s, TenantSource::Header).unwrap())
    }

    fn api_key(client_ids: ClientIds) -> TenantsConfig {
        TenantsConfig {
            from: TenantFrom::ApiKey,
            client_ids,
            ..TenantsConfig::default()
        }
    }

    #[test]
    fn header_mode_takes_the_client_id() {
        let cfg = TenantsConfig::default();
        let h = with_key("k");
        assert_eq!(resolve(&cfg, &h, id("a")).unwrap(), id("a"));
        assert_eq!(resolve(&cfg, &HeaderMap::new(), None).unwrap(), None);
    }

    #[test]
    fn api_key_mode_needs_a_key_and_hashes_it() {
        let cfg = api_key(ClientIds::Scope);
        let e = resolve(&cfg, &HeaderMap::new(), None).unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        let e = resolve(&cfg, &with_key(""), None).unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        let a = resolve(&cfg, &with_key("ka"), None).unwrap().unwrap();
        let b = resolve(&cfg, &with_key("kb"), None).unwrap().unwrap();
        assert_ne!(a, b);
        assert!(!a.as_str().contains("ka"));
    }

    #[test]
    fn client_ids_are_scoped_or_refused() {
        let own = TenantId::from_api_key("ka");
        let scoped = resolve(&api_key(ClientIds::Scope), &with_key("ka"), id("x"));
        assert_eq!(scoped.unwrap().unwrap().as_str(), format!("{own}/x"));
        let e = resolve(&api_key(ClientIds::Refuse), &with_key("ka"), id("x")).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        let alone = resolve(&api_key(ClientIds::Refuse), &with_key("ka"), None);
        assert_eq!(alone.unwrap(), Some(own));
    }
}
