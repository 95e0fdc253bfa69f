//! The routing wing: a request's plan and pick (`route`), forwarding it
//! to the engine (`proxy`), pools and their members (`pool`, `backend`),
//! response affinity (`affinity`), the loads routing reads (`load_board`,
//! `load_cell`, `loads`) and the warmest chains (`hot`).

pub(crate) mod affinity;
pub(crate) mod backend;
pub(crate) mod hot;
pub(crate) mod load_board;
pub(crate) mod load_cell;
pub(crate) mod loads;
pub(crate) mod pool;
pub(crate) mod proxy;
pub(crate) mod route;
