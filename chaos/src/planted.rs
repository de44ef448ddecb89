//! Which checker names the invariant each planted bug breaks: the one that must catch it (`ci/chaos --planted`).

use cellog_planted::Mutant;

/// The short name of the `cellog-check` checker whose property `mutant` breaks.
pub fn invariant(mutant: Mutant) -> &'static str {
    match mutant {
        Mutant::AckBeforeFsync
        | Mutant::PurgePastDurable
        | Mutant::StaleLeaderWrite
        | Mutant::OldOwnerAcceptsWrites
        | Mutant::Canary => "lost",
        Mutant::EpochOffByOne => "fenced",
        Mutant::CommitAppliedTwice | Mutant::DedupIgnored => "duplicate",
        // A body lost with the log is a message no consumer can be handed: it stays in its stream, never delivered.
        Mutant::FetchSkipsMessage | Mutant::InLogNotCopied => "delivery",
        Mutant::AbortShowsStaged => "transactions",
        Mutant::PeerProgressOverstated => "watermark",
        Mutant::MirrorSnapshotSkipsRange => "mirror",
        Mutant::RefusedPublishStored => "unknown",
        Mutant::CommitReversesOrder => "order",
        Mutant::NackForgets | Mutant::AckWaitNeverExpires => "processed",
        Mutant::RedeliveryAfterAck => "redelivery",
        // A damaged body never passes unchecked (its reference carries its own crc32c): what does is a damaged log
        // entry, replayed by a restarted node, which then holds what no other replica applied at that index.
        Mutant::DedupNotInSnapshot | Mutant::SnapshotSkipsConsumers | Mutant::CrcNotChecked => "state",
        Mutant::RetentionIgnoresPeerWatermark => "watermark",
        Mutant::DelayedVisibleEarly => "delayed",
        Mutant::LeaderTimeNotMonotonic => "cell-time",
        Mutant::GrantCheckSkipped | Mutant::NodeHeaderAccepted => "grants",
        Mutant::StaleGenerationAcked => "group",
        Mutant::HandoverSkipsUnacked => "handover",
    }
}

/// Whether `mutant` breaks an invariant only many cells can show (a stream moving between cells, a mirror of another
/// cell's stream): swept with the workload across cells (`ci/chaos --moves`), not the mixed workload of one cell.
pub fn across_cells(mutant: Mutant) -> bool {
    matches!(mutant, Mutant::OldOwnerAcceptsWrites | Mutant::MirrorSnapshotSkipsRange)
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    #[test]
    fn every_planted_bug_names_a_checker_that_exists() {
        for mutant in Mutant::iter() {
            let name = invariant(mutant);
            assert!(cellog_check::ALL.iter().any(|checker| checker.name == name), "{mutant:?} names {name}");
        }
    }
}
