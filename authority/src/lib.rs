//! dnsplan's authority: the authoritative DNS server for the managed DNS zone, and the
//! control API through which planners and enactors reach the store it serves from.

pub mod control;
