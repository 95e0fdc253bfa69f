//! The API wing: the OpenAI and native handlers (`openai`), the rest of
//! vLLM's surface (`surface`), the tenant's `cache_salt` (`salt`), stored
//! responses (`responses`) and `/v1/models` (`models`).

pub(crate) mod models;
pub(crate) mod openai;
pub(crate) mod responses;
pub(crate) mod salt;
pub(crate) mod surface;
