//! The accept loop of the DNS TCP listener and the control API: `dnsplan_common::accept`,
//! shared with every HTTP server of the daemons (`dnsplan_common::http_server`).

pub use dnsplan_common::accept::*;
