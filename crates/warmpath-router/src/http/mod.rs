//! The HTTP wing: connections and their limits, request ids and the access log,
//! tenancy, reading bodies, the work pool and the error answers.

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
