//! What a test of a cell leaves behind, and the properties it must have.
//!
//! - [`history`]: every client operation as an invocation and a completion (ok, fail, or unknown), in the time of
//!   whoever ran it; [`record`]: the shared recorder clients write it with as a run goes (and, with the `client`
//!   feature, how a client call's result becomes a completion).
//! - [`evidence`]: a history, what every node holds at the end, and what the workload promised (which consumer must
//!   be handed which stream, which peer mirrors which stream).
//! - [`checkers`]: one file per property, each a pure function of the evidence.
//! - [`script`]: hand-written histories, for the checkers' own tests.
//!
//! Nothing here runs a cell: the simulator, the chaos sweep and tests of real processes all record into these types
//! and run these checkers, which are tested here against histories that must pass and histories that must fail.

pub mod checkers;
pub mod evidence;
pub mod history;
pub mod record;
pub mod script;

pub use checkers::{ALL, Checker, Violation, check_all};
pub use evidence::{Duties, Evidence, Held, NodeId, NodeState, Stored};
