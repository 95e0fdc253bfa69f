//! The routing wing: a request's plan and pick (`route`), forwarding it
//! to the engine (`proxy`), pools and their members (`pool`, `backend`),
//! response affinity (`affinity`), what each backend is known to carry
//! (`loads`), the warmest chains (`hot`), what forwarding needs
//! of the router (`upstream`) and the seam to the other replicas (`share`).

pub(crate) mod affinity;
pub(crate) mod backend;
pub(crate) mod hot;
pub(crate) mod loads;
pub(crate) mod pool;
pub(crate) mod proxy;
pub(crate) mod route;
pub(crate) mod send_watch;
pub(crate) mod share;
pub(crate) mod upstream;
