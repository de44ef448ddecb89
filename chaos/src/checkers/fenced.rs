//! A fenced producer never commits, and nothing it staged becomes visible.

use cellog_sim::history::{Completion, Op};

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker = Checker { property: "a fenced producer never commits", check };

/// The process of the instance replaced midway (`cellog_sim::mixed::ZOMBIE_ROUND`).
const ZOMBIE: &str = "zombie";

fn check(evidence: &Evidence) -> Result<(), String> {
    for (process, op, done) in &evidence.operations {
        if process == ZOMBIE
            && let (Op::Txn { step, epoch, .. }, Some(Completion::Ok(_))) = (op, done)
            && matches!(*step, "commit" | "prepare")
        {
            return Err(format!("the fenced instance (epoch {epoch}) could {step}"));
        }
    }
    for (node, stored) in &evidence.stored {
        if let Some(msg_id) = stored.keys().find(|id| id.starts_with(ZOMBIE)) {
            return Err(format!("node {node} holds {msg_id}, staged by the fenced instance"));
        }
    }
    if let Some((consumer, _)) = fetches(evidence)
        .find(|(_, seen)| seen.iter().any(|m| m.msg_id.as_deref().is_some_and(|id| id.starts_with(ZOMBIE))))
    {
        return Err(format!("{consumer} was handed a message staged by the fenced instance"));
    }
    Ok(())
}
