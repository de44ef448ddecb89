//! A stream's rate limit: a token bucket on cell time, in whole thousandths of a token so that every replica
//! computes the same level.

use serde::Serialize;

use crate::config::RateLimit;
use crate::snapshot::v3;
use crate::time::Millis;

/// A deterministic token bucket, in thousandths of a token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct TokenBucket {
    pub millitokens: u64,
    pub refilled_at: Millis,
}

impl From<v3::TokenBucket> for TokenBucket {
    fn from(bucket: v3::TokenBucket) -> Self {
        TokenBucket { millitokens: bucket.millitokens, refilled_at: bucket.refilled_at.into() }
    }
}

impl TokenBucket {
    #[inline]
    pub(crate) fn full(rate: RateLimit, at: Millis) -> Self {
        TokenBucket { millitokens: u64::from(rate.burst) * 1000, refilled_at: at }
    }

    #[inline]
    pub(crate) fn refill(&mut self, rate: RateLimit, at: Millis) {
        let earned = at.since(self.refilled_at).saturating_mul(u64::from(rate.messages_per_second));
        self.millitokens = self.millitokens.saturating_add(earned).min(u64::from(rate.burst) * 1000);
        self.refilled_at = self.refilled_at.max(at);
    }

    /// Takes one token, or says how long until one is there.
    #[inline]
    pub(crate) fn take(&mut self, rate: RateLimit, at: Millis) -> Result<(), u64> {
        self.refill(rate, at);
        if self.millitokens >= 1000 {
            self.millitokens -= 1000;
            Ok(())
        } else {
            Err((1000 - self.millitokens).div_ceil(u64::from(rate.messages_per_second)))
        }
    }
}
