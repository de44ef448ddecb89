//! Every parameter of a run comes from one seed, split into one `rand_chacha` stream per concern, so that drawing more
//! of one (say, a longer workload) never shifts another (the fault schedule).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a stream of random numbers decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concern {
    /// Which faults, when, and where.
    Faults,
    /// What clients send, and what consumers do with deliveries.
    Workload,
    /// Loss and latency of the simulated network.
    Network,
    /// The fault draws of one node's disk.
    Disk(u64),
    /// The envelope ids one node picks.
    Mail(u64),
}

impl Concern {
    fn stream(self) -> u64 {
        match self {
            Concern::Faults => 1,
            Concern::Workload => 2,
            Concern::Network => 3,
            Concern::Disk(node) => 1_000 + node,
            Concern::Mail(node) => 2_000 + node,
        }
    }
}

/// The seed of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seeds(pub u64);

impl Seeds {
    /// The seed madsim runs with (`MADSIM_TEST_SEED`): the one seed of the whole run.
    pub fn current() -> Seeds {
        Seeds(madsim::runtime::Handle::current().seed())
    }

    /// The stream for `concern`.
    pub fn rng(self, concern: Concern) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.0);
        rng.set_stream(concern.stream());
        rng
    }

    /// The seed of node `node`'s disk.
    pub fn disk(self, node: u64) -> u64 {
        use rand::RngCore;
        self.rng(Concern::Disk(node)).next_u64()
    }

    /// The seed of node `node`'s envelope ids.
    pub fn mail(self, node: u64) -> u64 {
        use rand::RngCore;
        self.rng(Concern::Mail(node)).next_u64()
    }
}

#[cfg(test)]
mod tests {
    use rand::RngCore;

    use super::*;

    #[test]
    fn concerns_draw_from_separate_streams_and_seeds_repeat() {
        let seeds = Seeds(7);
        let faults = seeds.rng(Concern::Faults).next_u64();
        assert_eq!(faults, seeds.rng(Concern::Faults).next_u64());
        assert_ne!(faults, seeds.rng(Concern::Workload).next_u64());
        assert_ne!(seeds.disk(1), seeds.disk(2));
        assert_ne!(faults, Seeds(8).rng(Concern::Faults).next_u64());
    }
}
