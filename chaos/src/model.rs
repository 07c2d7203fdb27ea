//! A stateright model of the plan protocol: a planner publishing generations, enactors that
//! read a plan and write it later after arbitrary delays, cleanup, and the store deciding.
//!
//! One endpoint and a few generations are enough: the 2025 race needs only an enactor that
//! read an old plan, a newer plan applied meanwhile, and a cleanup. The model runs in two
//! variants. `Fenced` is dnsplan: the store compares the fence at write time, refuses a
//! cleaned-up generation, cleanup keeps the active plan, and served records are copies.
//! `Naive` is the 2025 system: a one-time "is my plan newer" check when the enactor reads,
//! unconditional writes, age-only cleanup, and served records that point into their plan.
//!
//! Properties: never empty (once served), never backwards, served data was published, the
//! active plan is never deleted, and the latest plan can be served.

use stateright::{Model, Property};

/// Which protocol the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Fenced,
    Naive,
}

#[derive(Clone, Debug)]
pub struct PlanModel {
    pub variant: Variant,
    /// Generations the planner publishes (1..=generations).
    pub generations: u8,
    pub enactors: usize,
    /// Plans cleanup keeps by age (the last `retain`).
    pub retain: u8,
}

/// An enactor between reading a plan and writing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Enactor {
    Idle,
    /// Read plan `g` and will write it (after any delay: other actions interleave freely).
    Holding(u8),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub latest: u8,
    /// Plans still stored, as a bit set (bit g).
    pub stored: u32,
    /// The endpoint's fence: the generation last written, 0 for none.
    pub active: u8,
    /// What the endpoint serves now (a generation's addresses), 0 for nothing.
    pub served: u8,
    /// The highest generation ever served.
    pub high_water: u8,
    pub went_backwards: bool,
    pub enactors: Vec<Enactor>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Publish,
    /// Enactor i reads the latest plan.
    Read(usize),
    /// Enactor i writes the plan it holds.
    Write(usize),
    Cleanup,
}

impl State {
    fn is_stored(&self, g: u8) -> bool {
        g > 0 && self.stored & (1 << g) != 0
    }

    fn oldest_stored(&self) -> u8 {
        (1..=self.latest).find(|g| self.is_stored(*g)).unwrap_or(0)
    }
}

impl PlanModel {
    pub fn new(variant: Variant) -> PlanModel {
        PlanModel { variant, generations: 3, enactors: 2, retain: 1 }
    }

    /// What the endpoint serves in state `s` after a write or cleanup.
    fn serve(&self, s: &mut State) {
        let now = match self.variant {
            // Records are copies taken at apply time: whatever was written stays served.
            Variant::Fenced => s.active,
            // Records point into their plan: a deleted plan serves nothing.
            Variant::Naive => {
                if s.is_stored(s.active) {
                    s.active
                } else {
                    0
                }
            }
        };
        if now != 0 && now < s.high_water {
            s.went_backwards = true;
        }
        s.high_water = s.high_water.max(now);
        s.served = now;
    }
}

impl Model for PlanModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            latest: 0,
            stored: 0,
            active: 0,
            served: 0,
            high_water: 0,
            went_backwards: false,
            enactors: vec![Enactor::Idle; self.enactors],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.latest < self.generations {
            actions.push(Action::Publish);
        }
        for (i, e) in s.enactors.iter().enumerate() {
            match e {
                Enactor::Idle if s.latest > 0 => actions.push(Action::Read(i)),
                Enactor::Holding(_) => actions.push(Action::Write(i)),
                Enactor::Idle => {}
            }
        }
        if s.oldest_stored() > 0 {
            actions.push(Action::Cleanup);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Publish => {
                s.latest += 1;
                s.stored |= 1 << s.latest;
            }
            Action::Read(i) => {
                let g = s.latest;
                if !s.is_stored(g) {
                    return None;
                }
                // The naive enactor's one-time check, trusted by its later write.
                if self.variant == Variant::Naive && s.active >= g {
                    return None;
                }
                s.enactors[i] = Enactor::Holding(g);
            }
            Action::Write(i) => {
                let Enactor::Holding(g) = s.enactors[i] else { return None };
                s.enactors[i] = Enactor::Idle;
                match self.variant {
                    Variant::Fenced => {
                        // Decided inside the store at write time: refused when the plan was
                        // cleaned up or the fence is already at g or newer.
                        if s.is_stored(g) && g > s.active {
                            s.active = g;
                        }
                    }
                    Variant::Naive => s.active = g,
                }
                self.serve(&mut s);
            }
            Action::Cleanup => {
                let by_age = s.latest.saturating_sub(self.retain) + 1;
                let horizon = match self.variant {
                    // Never the active plan or anything newer than it.
                    Variant::Fenced if s.active > 0 => by_age.min(s.active),
                    Variant::Fenced => by_age,
                    Variant::Naive => by_age,
                };
                let before = s.stored;
                for g in 1..horizon {
                    s.stored &= !(1 << g);
                }
                if s.stored == before {
                    return None;
                }
                self.serve(&mut s);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never empty", |_, s: &State| s.high_water == 0 || s.served != 0),
            Property::always("never backwards", |_, s: &State| !s.went_backwards),
            Property::always("served data was published", |_, s: &State| s.served <= s.latest),
            Property::always("active plan never deleted", |_, s: &State| s.active == 0 || s.is_stored(s.active)),
            Property::sometimes("latest plan served", |m: &PlanModel, s: &State| s.latest == m.generations && s.served == m.generations),
        ]
    }
}
