//! Test-only fault hooks and the naive 2025 behaviour (feature `testing`).
//!
//! The race tests use `Hooks::before_write` to hold one enactor just before it writes a given
//! endpoint while others move on, and `Hooks::event` to learn, without polling, when an
//! enactor finished a plan. `Behaviour::Naive` reproduces the enactor of the October 2025
//! outage, so that the tests can show their checker catching it.

use dnsplan_common::{EndpointName, Generation};
use std::future::Future;
use std::pin::Pin;

/// What an enactor reports to the hooks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Applied (and verified, and cleaned up after) this plan fully.
    PlanDone { enactor: String, generation: Generation },
    /// Gave up on this plan (newer plan, pruned, deadline or store error).
    PlanAbandoned { enactor: String, generation: Generation },
    /// Refused this plan (invalid, or removing too much weight).
    PlanRefused { enactor: String, generation: Generation },
}

pub type HookFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Hooks: Send + Sync + 'static {
    /// Awaited just before each endpoint write; delay here to make an enactor slow.
    fn before_write<'a>(&'a self, enactor: &'a str, generation: Generation, endpoint: &'a EndpointName) -> HookFuture<'a>;
    /// Awaited after a plan was applied (and verified) and before the cleanup that follows.
    fn before_cleanup<'a>(&'a self, enactor: &'a str, generation: Generation) -> HookFuture<'a>;
    fn event(&self, event: Event);
}

/// No faults.
pub struct NoHooks;

impl Hooks for NoHooks {
    fn before_write<'a>(&'a self, _: &'a str, _: Generation, _: &'a EndpointName) -> HookFuture<'a> {
        Box::pin(async {})
    }
    fn before_cleanup<'a>(&'a self, _: &'a str, _: Generation) -> HookFuture<'a> {
        Box::pin(async {})
    }
    fn event(&self, _: Event) {}
}

/// How the enactor decides what to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Behaviour {
    /// Every write through the store's fence; stale skipped; newer plans preempt older ones.
    #[default]
    Fenced,
    /// The 2025 enactor: one check that its plan is newer than what is active, then every
    /// write trusting that check, never looking at newer plans. Test-only.
    Naive,
}
