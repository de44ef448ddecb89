//! Retention never deletes below a peer's watermark: nothing a registered peer has not received is removed. Each of
//! the peer's reads starts where its previous one ended, so it must begin exactly at the sequence it asked for and go
//! on without a gap; and at the end every node still holds each acknowledged message past the highest progress the
//! peer may have reported.

use crate::history::{Op, Value};

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker =
    Checker { name: "watermark", property: "retention never deletes below a peer's watermark", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (feed, peer) in &evidence.duties.peers {
        let mut watermark = 0;
        for operation in evidence.operations.iter().filter(|operation| &operation.process == peer) {
            match (&operation.op, operation.ok()) {
                (Op::Read { stream, partition, from }, Some(Value::Messages(seen))) if stream == feed => {
                    let expected = (*from..).take(seen.len());
                    if let Some((got, want)) = seen.iter().map(|m| m.seq).zip(expected).find(|(got, want)| got != want)
                    {
                        return Err(format!(
                            "{peer} read {feed}/{partition} from {from} and got {got} where {want} should be: removed \
                             before it was received"
                        ));
                    }
                }
                // A progress report that was refused did not happen; one that succeeded or timed out may have.
                (Op::PeerProgress { stream, received_seq, .. }, _) if stream == feed && !operation.refused() => {
                    watermark = u64::max(watermark, *received_seq);
                }
                _ => {}
            }
        }
        let Some(nodes) = evidence.held.get(feed) else { continue };
        for ack in acks(evidence).filter(|ack| ack.stream == feed && ack.seq > watermark) {
            for (node, stored) in nodes {
                let held = stored.get(ack.msg_id).is_some_and(|copies| copies.iter().any(|c| c.seq == ack.seq));
                if !held {
                    return Err(format!(
                        "node {node} lacks {} at {feed}/{}/{}, past {peer}'s watermark {watermark}",
                        ack.msg_id, ack.partition, ack.seq
                    ));
                }
            }
        }
    }
    Ok(())
}
