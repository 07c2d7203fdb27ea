//! Hook points in the enactor's loop, and the choice of how it writes.
//!
//! Every build has the hook points; an enactor calls `NoHooks` unless a caller installs other
//! hooks (`Enactor::with_hooks`), and the daemons install none. Tests install their own: the
//! race tests hold one enactor just before it writes a given endpoint while others move on
//! (`Hooks::before_write`), and learn without polling when an enactor finished a plan
//! (`Hooks::event`).
//!
//! `Behaviour::Naive` reproduces the enactor of the October 2025 outage, so that the tests can
//! show their checker catching it. It exists only with feature `testing`; without it
//! `Behaviour` has the one value `Fenced`, so nothing can switch an enactor to anything else.

use dnsplan_common::{EndpointName, Generation};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

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

/// No faults: what every enactor runs unless a test installs other hooks.
pub struct NoHooks;

impl Hooks for NoHooks {
    fn before_write<'a>(&'a self, _: &'a str, _: Generation, _: &'a EndpointName) -> HookFuture<'a> {
        ready()
    }
    fn before_cleanup<'a>(&'a self, _: &'a str, _: Generation) -> HookFuture<'a> {
        ready()
    }
    fn event(&self, _: Event) {}
}

/// A finished future that costs no allocation: `poll_fn` over a closure without captures is
/// zero-sized, and boxing a zero-sized value allocates nothing (`async {}` is one byte, so it
/// would cost an allocation per endpoint written).
fn ready<'a>() -> HookFuture<'a> {
    Box::pin(std::future::poll_fn(|_| Poll::Ready(())))
}

/// How the enactor decides what to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Behaviour {
    /// Every write through the store's fence; stale skipped; newer plans preempt older ones.
    #[default]
    Fenced,
    /// The 2025 enactor: one check that its plan is newer than what is active, then every
    /// write trusting that check, never looking at newer plans. Feature `testing` only.
    #[cfg(feature = "testing")]
    Naive,
}

impl Behaviour {
    /// `Naive` where this build has it (feature `testing`), else `None`: lets a harness offer
    /// the 2025 enactor without naming a variant that production builds do not have.
    #[cfg(feature = "testing")]
    pub const NAIVE_2025: Option<Behaviour> = Some(Behaviour::Naive);
    /// `Naive` where this build has it (feature `testing`), else `None`: lets a harness offer
    /// the 2025 enactor without naming a variant that production builds do not have.
    #[cfg(not(feature = "testing"))]
    pub const NAIVE_2025: Option<Behaviour> = None;
}
