//! A branch's payload: the bytes a participant receives.
//!
//! Over HTTP a payload is the body (text: the JSON a client submitted); over gRPC it is the
//! request message, which DTM's clients send as protobuf bytes. One type holds both, so a
//! payload is compared, hashed and stored as its bytes, and shown as text where it is text.

use std::fmt;
use std::sync::Arc;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The bytes sent to a participant. Cheap to clone: branches of one saga step share them.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Payload(Arc<[u8]>);

impl Payload {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The payload as text, when it is UTF-8 (every payload sent over HTTP is).
    pub fn as_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for Payload {
    fn from(text: &str) -> Payload {
        Payload(text.as_bytes().into())
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Payload {
        Payload(text.into_bytes().into())
    }
}

impl From<&[u8]> for Payload {
    fn from(bytes: &[u8]) -> Payload {
        Payload(bytes.into())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Payload {
        Payload(bytes.into())
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_text() {
            Some(text) => fmt::Debug::fmt(text, f),
            None => write!(f, "<{} bytes, not UTF-8>", self.0.len()),
        }
    }
}

/// Text as a string, other bytes as bytes: what a reader of the serialised form expects.
impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.as_text() {
            Some(text) => serializer.serialize_str(text),
            None => serializer.serialize_bytes(&self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Payload, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Payload;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Payload, E> {
                Ok(v.into())
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Payload, E> {
                Ok(v.into())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Payload, A::Error> {
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(bytes.into())
            }
        }
        deserializer.deserialize_any(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_text_and_other_bytes_are_not() {
        let text = Payload::from("{\"n\":1}");
        assert_eq!(text.as_text(), Some("{\"n\":1}"));
        assert_eq!(format!("{text:?}"), "\"{\\\"n\\\":1}\"");
        let binary = Payload::from(vec![0x0a, 0xff, 0x00]);
        assert_eq!(binary.as_text(), None);
        assert_eq!(binary.as_bytes(), &[0x0a, 0xff, 0x00]);
        assert_eq!(format!("{binary:?}"), "<3 bytes, not UTF-8>");
        assert_eq!(Payload::from("a"), Payload::from(b"a".to_vec()));
    }

    #[test]
    fn both_kinds_round_trip_through_serde() {
        for payload in [Payload::from("héllo"), Payload::from(vec![0xc3, 0x28, 1])] {
            let json = serde_json::to_string(&payload).unwrap();
            let back: Payload = serde_json::from_str(&json).unwrap();
            assert_eq!(back, payload);
        }
    }
}
