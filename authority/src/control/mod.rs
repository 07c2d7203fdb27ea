//! The control API: HTTP in front of the store, for planners, enactors, the CLI and people.
//!
//! - `access.rs`: credentials, roles, and which role each route needs.
//! - `routes.rs`: the routes, one per `Store` operation.
//! - `gate.rs`: the front door, answering health and readiness before the store is reached.
//! - `server.rs`: the bounded HTTP server it runs on.
//! - `ui.rs`: the status page.

pub mod access;
pub mod gate;
pub mod routes;
pub mod server;
pub mod ui;
