//! Retention never deletes below a peer's watermark: nothing the registered mirror has not received is removed. Each
//! of the mirror's reads starts where its previous one ended, so it must begin exactly at the sequence it asked for
//! and go on without a gap; and at the end every node still holds each acknowledged message past the highest
//! progress the mirror may have reported.

use cellog_sim::history::{Completion, Op, Value};
use cellog_sim::mixed::{FEED, MIRROR};

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker = Checker { property: "retention never deletes below a peer's watermark", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut watermark = 0;
    for (process, op, done) in &evidence.operations {
        match (op, done) {
            (Op::Read { stream, partition, from }, Some(Completion::Ok(Value::Messages(seen))))
                if process == MIRROR && stream == FEED =>
            {
                let expected = (*from..).take(seen.len());
                if let Some((got, want)) = seen.iter().map(|m| m.seq).zip(expected).find(|(got, want)| got != want) {
                    return Err(format!(
                        "{MIRROR} read {FEED}/{partition} from {from} and got {got} where {want} should be: removed \
                         before it was received"
                    ));
                }
            }
            // A progress report that was refused did not happen; one that succeeded or timed out may have.
            (Op::PeerProgress { received_seq, .. }, done) if !matches!(done, Some(Completion::Fail(_))) => {
                watermark = watermark.max(*received_seq);
            }
            _ => {}
        }
    }
    for ack in acks(evidence).filter(|ack| ack.stream == FEED && ack.seq > watermark) {
        for (node, stored) in &evidence.feed {
            let held = stored.get(ack.msg_id).is_some_and(|copies| copies.iter().any(|&(_, seq, _)| seq == ack.seq));
            if !held {
                return Err(format!(
                    "node {node} lacks {} at {FEED}/{}, past {MIRROR}'s watermark {watermark}",
                    ack.msg_id, ack.seq
                ));
            }
        }
    }
    Ok(())
}
