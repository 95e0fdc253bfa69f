//! The HTTP wing: the router's clock (`clock`), accepting client
//! connections (`front`), their limits and watchdogs (`conn`, `socket`),
//! each request's id, span and access log (`requests`), who is asking
//! (`tenancy`: the pool's `tenants:` rule), reading bodies under their
//! budgets (`incoming`), what rides on an answer's body (`layer`), the work
//! pool for big bodies (`work`) and the error answers (`error`).

pub(crate) mod clock;
pub(crate) mod conn;
pub(crate) mod error;
pub(crate) mod front;
pub(crate) mod incoming;
pub(crate) mod layer;
pub(crate) mod requests;
pub(crate) mod socket;
pub(crate) mod tenancy;
pub(crate) mod work;
