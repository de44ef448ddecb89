//! One partition of a stream: an ordered log of messages, sequences from 1, and the messages themselves. It sits
//! beneath both the stream (which appends and removes) and its consumers (which read).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use crate::body::BodyRef;
use crate::command::Headers;
use crate::headers::{Packed, header_bytes};
use crate::outcome::{Body, Record};
use crate::snapshot::v3;
use crate::time::Millis;

/// A stored message. Kept small (the common fields inline, the rare ones boxed) because partitions hold millions of
/// them and move them when they grow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Message {
    /// Arrival order across the stream's partitions; eviction takes the smallest first.
    pub stream_seq: u64,
    /// Shared by every message on the subject, also when decoded from a snapshot.
    pub subject: Arc<str>,
    pub msg_id: Option<Arc<str>>,
    /// Where the payload is stored (see [`crate::body`]).
    pub body: BodyRef,
    pub stored_at: Millis,
    /// Shared with the messages before it in the partition that carry equal extras (see [`Partition::extras_like`]).
    pub extras: Option<Arc<Extras>>,
}

/// What few messages carry (but every message published by a caller carries its stamped sender, a header). Held
/// behind a shared pointer: a publisher's messages mostly carry the same headers (its stamped sender) and nothing
/// else, and a million of them then hold one copy. Encoded as the value it points to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Extras {
    pub key: Option<Bytes>,
    pub headers: Packed,
    pub expires_at: Option<Millis>,
    pub deliver_at: Option<Millis>,
    pub recalled_at: Option<Millis>,
}

impl From<v3::Extras> for Extras {
    fn from(extras: v3::Extras) -> Self {
        Extras {
            key: extras.key,
            headers: extras.headers,
            expires_at: extras.expires_at.map(Millis::from),
            deliver_at: extras.deliver_at.map(Millis::from),
            recalled_at: extras.recalled_at.map(Millis::from),
        }
    }
}

impl From<v3::Message> for Message {
    fn from(message: v3::Message) -> Self {
        Message {
            stream_seq: message.stream_seq,
            subject: message.subject,
            msg_id: message.msg_id,
            body: message.body.into(),
            stored_at: message.stored_at.into(),
            extras: message.extras.map(|extras| Arc::new(Extras::from(*extras))),
        }
    }
}

impl Message {
    #[inline]
    pub fn accounted_size(subject: &str, key: Option<&Bytes>, headers: &Headers, payload_len: usize) -> u64 {
        let pairs = headers.iter().map(|(name, value)| (name.as_str(), value.as_str()));
        Message::size_of(subject, key, header_bytes(pairs), payload_len)
    }

    #[inline]
    fn size_of(subject: &str, key: Option<&Bytes>, header_bytes: usize, payload_len: usize) -> u64 {
        (subject.len() + key.map_or(0, Bytes::len) + header_bytes + payload_len) as u64
    }

    /// Bytes counted against limits: subject, key, headers and payload (none once recalled). Computed rather than
    /// stored: partitions hold millions of messages.
    #[inline]
    pub fn size(&self) -> u64 {
        Message::size_of(&self.subject, self.key(), self.headers().map_or(0, Packed::bytes), self.body.len as usize)
    }

    #[inline]
    pub fn key(&self) -> Option<&Bytes> {
        self.extras.as_ref().and_then(|extras| extras.key.as_ref())
    }

    #[inline]
    pub fn headers(&self) -> Option<&Packed> {
        self.extras.as_ref().map(|extras| &extras.headers)
    }

    #[inline]
    pub fn expires_at(&self) -> Option<Millis> {
        self.extras.as_ref().and_then(|extras| extras.expires_at)
    }

    #[inline]
    pub fn deliver_at(&self) -> Option<Millis> {
        self.extras.as_ref().and_then(|extras| extras.deliver_at)
    }

    #[inline]
    pub fn recalled_at(&self) -> Option<Millis> {
        self.extras.as_ref().and_then(|extras| extras.recalled_at)
    }

    /// The message as readers see it: its body by reference.
    #[inline]
    pub fn record(&self, partition: u32, seq: u64) -> Record {
        Record {
            partition,
            seq,
            subject: self.subject.clone(),
            key: self.key().cloned(),
            msg_id: self.msg_id.clone(),
            headers: self.headers().map(Packed::to_headers).unwrap_or_default(),
            body: match self.recalled_at() {
                Some(recalled_at) => Body::Tombstone { recalled_at },
                None => Body::Stored(self.body),
            },
            stored_at: self.stored_at,
        }
    }
}

/// One ordered log. Sequences start at 1; `slots[0]` holds `first_seq` and is never a hole, so the low watermark is
/// always the first retained message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Partition {
    pub first_seq: u64,
    pub slots: VecDeque<Option<Message>>,
    pub n_messages: u64,
    pub n_bytes: u64,
}

impl From<v3::Partition> for Partition {
    fn from(partition: v3::Partition) -> Self {
        // Collected from a `Vec` into a `Vec`, the slots stay in their allocation: a partition can hold millions.
        // Equal extras of neighbouring messages are shared again, as they were before the snapshot.
        let mut newest: Option<Arc<Extras>> = None;
        let mut slots: Vec<Option<Message>> = partition
            .slots
            .into_iter()
            .map(|slot| {
                slot.map(|message| {
                    let mut message = Message::from(message);
                    if let Some(extras) = &mut message.extras {
                        match &newest {
                            Some(shared) if shared == extras => *extras = shared.clone(),
                            _ => newest = Some(extras.clone()),
                        }
                    }
                    message
                })
            })
            .collect();
        // Decoding grew the vector by doubling from a cautious guess: up to twice the memory the slots need.
        slots.shrink_to_fit();
        Partition {
            first_seq: partition.first_seq,
            slots: slots.into(),
            n_messages: partition.n_messages,
            n_bytes: partition.n_bytes,
        }
    }
}

impl Partition {
    #[inline]
    pub(crate) fn new() -> Self {
        Partition { first_seq: 1, slots: VecDeque::new(), n_messages: 0, n_bytes: 0 }
    }

    /// The sequence the next append gets.
    #[inline]
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.slots.len() as u64
    }

    /// The last sequence ever assigned (0 before the first append).
    #[inline]
    pub fn last_seq(&self) -> u64 {
        self.next_seq() - 1
    }

    #[inline]
    pub fn get(&self, seq: u64) -> Option<&Message> {
        let index = seq.checked_sub(self.first_seq)?;
        self.slots.get(usize::try_from(index).ok()?)?.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, seq: u64) -> Option<&mut Message> {
        let index = seq.checked_sub(self.first_seq)?;
        self.slots.get_mut(usize::try_from(index).ok()?)?.as_mut()
    }

    #[inline]
    pub fn front(&self) -> Option<(u64, &Message)> {
        self.slots.front().map(|slot| (self.first_seq, slot.as_ref().expect("the front slot is never a hole")))
    }

    /// The extras of the partition's newest message, when they equal the ones described (never a recalled
    /// message's): a message appended with these shares them rather than holding a copy of its own.
    #[inline]
    pub(crate) fn extras_like(
        &self,
        key: Option<&Bytes>,
        headers: &Headers,
        expires_at: Option<Millis>,
        deliver_at: Option<Millis>,
    ) -> Option<Arc<Extras>> {
        let extras = self.slots.back()?.as_ref()?.extras.as_ref()?;
        let same = extras.key.as_ref() == key
            && extras.expires_at == expires_at
            && extras.deliver_at == deliver_at
            && extras.recalled_at.is_none()
            && extras.headers.iter().eq(headers.iter().map(|(name, value)| (name.as_str(), value.as_str())));
        same.then(|| extras.clone())
    }

    #[inline]
    pub(crate) fn push(&mut self, message: Message) -> u64 {
        let seq = self.next_seq();
        self.n_messages += 1;
        self.n_bytes += message.size();
        self.slots.push_back(Some(message));
        seq
    }

    /// Moves the next sequence on to `next`, leaving holes for the sequences passed over (an empty partition just
    /// starts there, so the front slot is never a hole). Never moves it back.
    pub(crate) fn skip_to(&mut self, next: u64) {
        if self.slots.is_empty() {
            self.first_seq = self.first_seq.max(next);
            return;
        }
        while self.next_seq() < next {
            self.slots.push_back(None);
        }
    }

    #[inline]
    pub(crate) fn take(&mut self, seq: u64) -> Option<Message> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        let message = self.slots.get_mut(index)?.take()?;
        self.n_messages -= 1;
        self.n_bytes -= message.size();
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.first_seq += 1;
        }
        Some(message)
    }

    /// The first sequence whose message was stored at or after `time` (the next sequence if none).
    #[inline]
    pub fn first_seq_at_or_after(&self, time: Millis) -> u64 {
        self.slots
            .iter()
            .enumerate()
            .find_map(|(index, slot)| {
                slot.as_ref().filter(|message| message.stored_at >= time).map(|_| self.first_seq + index as u64)
            })
            .unwrap_or_else(|| self.next_seq())
    }
}
