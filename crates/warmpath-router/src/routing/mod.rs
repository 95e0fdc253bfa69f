//! The routing wing: plan and pick, forwarding, pools and members, response
//! affinity, loads, the warmest chains and the seam to the other replicas.

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
