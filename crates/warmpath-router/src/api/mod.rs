//! The API wing: the OpenAI and native handlers, the rest of vLLM's surface,
//! the tenant's `cache_salt`, stored responses and `/v1/models`.

pub(crate) mod models;
pub(crate) mod openai;
pub(crate) mod responses;
pub(crate) mod salt;
pub(crate) mod surface;
