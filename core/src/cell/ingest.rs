//! Messages copied in at the positions they hold on another cell: a stream moving here from the cell it moves from
//! (see [`crate::placement`]), a mirror from its source (see [`crate::mirror`]). The caller checks that the stream
//! takes such a copy.

use super::limits::{MAX_INGEST_GAP, invalid};
use super::publish::{append_message, store_body};
use super::{Cell, stream_in};
use crate::command::IngestMessage;
use crate::error::Rejection;
use crate::outcome::Outcome;

impl Cell {
    pub(super) fn ingest(
        &mut self,
        at: crate::time::Millis,
        name: &str,
        messages: Vec<IngestMessage>,
        through: &[u64],
    ) -> Result<Outcome, Rejection> {
        let stream = stream_in(&mut self.streams, name)?;
        let n = stream.partitions().len();
        if !through.is_empty() && through.len() != n {
            return Err(invalid(format!(
                "positions are given for {} partitions; stream {name:?} has {n} here",
                through.len()
            )));
        }
        // Everything is checked before anything changes.
        let max_payload = u64::from(stream.config().max_payload_bytes);
        let mut next: Vec<u64> = stream.partitions().iter().map(|p| p.next_seq()).collect();
        let mut holds: Vec<bool> = stream.partitions().iter().map(|p| !p.slots.is_empty()).collect();
        let mut previous = vec![0u64; n];
        let gap_checked = |holds: bool, next: u64, seq: u64| {
            if holds && seq.saturating_sub(next) > MAX_INGEST_GAP {
                return Err(invalid(format!(
                    "a copy may pass over at most {MAX_INGEST_GAP} sequences; from {next} to {seq} passes over more"
                )));
            }
            Ok(())
        };
        for message in &messages {
            let p = message.partition as usize;
            if p >= n {
                return Err(invalid(format!(
                    "stream {name:?} has {n} partitions; a copied message names partition {}",
                    message.partition
                )));
            }
            if message.seq <= previous[p] {
                return Err(invalid(format!(
                    "copied messages come in rising sequence per partition; {} follows {} in partition {p}",
                    message.seq, previous[p]
                )));
            }
            previous[p] = message.seq;
            if message.seq < next[p] {
                continue;
            }
            gap_checked(holds[p], next[p], message.seq)?;
            let size = message.request.payload.len() as u64;
            if size > max_payload {
                return Err(Rejection::PayloadTooLarge { size, max: max_payload });
            }
            (next[p], holds[p]) = (message.seq + 1, true);
        }
        for (p, &seq) in through.iter().enumerate() {
            gap_checked(holds[p], next[p], seq.saturating_add(1))?;
        }
        let mut appended = 0;
        for IngestMessage { partition, seq, mut request } in messages {
            let stream = self.streams.get_mut(name).expect("checked above");
            if seq < stream.partitions()[partition as usize].next_seq() {
                continue;
            }
            stream.skip_to(partition, seq);
            let body = store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload));
            append_message(stream, &mut self.timers, &mut self.effects, partition, request, body, at);
            appended += 1;
        }
        let stream = self.streams.get_mut(name).expect("checked above");
        for (p, &seq) in through.iter().enumerate() {
            stream.skip_to(p as u32, seq.saturating_add(1));
        }
        // Copied as the other cell held them, the messages may pass this stream's discard-old limits for a moment.
        stream.shrink_to_limits(&mut self.effects);
        Ok(Outcome::Ingested { appended, last_seqs: self.last_seqs(name) })
    }
}
