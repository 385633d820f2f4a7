//! JSON rewritten as text while it is read, without a `serde_json::Value` in between.
//!
//! A tree costs many times the text it was read from (every number in an array is a
//! 32-byte `Value`, and the array keeps spare room), so a megabyte of client JSON held as a
//! tree is tens of megabytes. What idem keeps of a payload is text anyway: [`JsonText`] is
//! the compact text `serde_json` prints for the `Value` a document parses to, and
//! [`write_canonical_text`] the canonical text ([`crate::canonical_json`]) of a document,
//! both written as the document is read. Neither differs from the tree's text by a byte:
//! object keys in byte order, a key given twice keeping its last value (as `Value`'s map
//! does), numbers as `Value` holds and prints them.
//!
//! The only thing held besides the output is each open object's entries (where each key
//! and value lie, and the keys themselves), until the object ends and is written sorted.

use std::fmt;
use std::io::Write;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A JSON value kept as the compact text `serde_json` prints for the `Value` it parses to
/// (`serde_json::from_str::<Value>(s)?.to_string()`), read without building that `Value`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct JsonText(String);

impl JsonText {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JsonText, D::Error> {
        let mut writer = Writer::new(Vec::new(), Numbers::AsValue);
        Node(&mut writer).deserialize(deserializer)?;
        Ok(JsonText(writer.into_text()))
    }
}

/// Appends to `out` the canonical text of the JSON document `text`: what
/// `canonical_json(&serde_json::from_str(text)?)` returns, without the tree. When `text` is
/// not JSON, `out` is left as it was and the parser's error returned.
pub fn write_canonical_text(text: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    let mark = out.len();
    let mut writer = Writer::new(std::mem::take(out), Numbers::Canonical);
    let mut parser = serde_json::Deserializer::from_str(text);
    let read = Node(&mut writer)
        .deserialize(&mut parser)
        .and_then(|()| parser.end());
    *out = writer.out;
    if read.is_err() {
        out.truncate(mark);
    }
    read
}

/// How numbers are written.
#[derive(Clone, Copy)]
enum Numbers {
    /// As `serde_json` prints the `Value` it parsed.
    AsValue,
    /// As [`crate::canonical_json`] writes them.
    Canonical,
}

struct Writer {
    out: Vec<u8>,
    /// The keys of the objects still open, one after the other.
    keys: Vec<u8>,
    numbers: Numbers,
}

impl Writer {
    fn new(out: Vec<u8>, numbers: Numbers) -> Writer {
        Writer {
            out,
            keys: Vec::new(),
            numbers,
        }
    }

    fn into_text(self) -> String {
        // Only serde_json's escaped strings, ASCII punctuation and digits were written.
        String::from_utf8(self.out).expect("JSON text is UTF-8")
    }

    fn float(&mut self, f: f64) {
        // `Value` holds a non-finite number as null; a parser never yields one.
        if !f.is_finite() {
            self.out.extend_from_slice(b"null");
            return;
        }
        match self.numbers {
            Numbers::AsValue => {
                serde_json::to_writer(&mut self.out, &f).expect("a float serializes");
            }
            Numbers::Canonical => crate::write_float(f, &mut self.out),
        }
    }

    /// Writes the object whose text starts at `start` again, its entries sorted by key
    /// and each key once (its last value), and forgets its keys.
    fn close_object(&mut self, start: usize, keys_start: usize, mut entries: Vec<Entry>) {
        let keys = &self.keys;
        // A stable sort: of a key given twice, the later entry stays the later one.
        entries.sort_by(|a, b| keys[a.key.clone()].cmp(&keys[b.key.clone()]));
        let mut text = Vec::with_capacity(self.out.len() - start + 2);
        text.push(b'{');
        let mut first = true;
        for (i, entry) in entries.iter().enumerate() {
            let key = &keys[entry.key.clone()];
            if entries
                .get(i + 1)
                .is_some_and(|next| keys[next.key.clone()] == *key)
            {
                continue;
            }
            if !first {
                text.push(b',');
            }
            first = false;
            let key = std::str::from_utf8(key).expect("keys are read as strings");
            crate::write_string(key, &mut text);
            text.push(b':');
            text.extend_from_slice(&self.out[entry.value.clone()]);
        }
        text.push(b'}');
        self.out.truncate(start);
        self.out.extend_from_slice(&text);
        self.keys.truncate(keys_start);
    }
}

/// Where an open object's entry lies: its key in `Writer::keys`, its value's text in
/// `Writer::out`.
struct Entry {
    key: Range<usize>,
    value: Range<usize>,
}

/// One value, written to the writer as it is read.
struct Node<'w>(&'w mut Writer);

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0
            .out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        write!(self.0.out, "{v}").expect("writing to a Vec cannot fail");
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        write!(self.0.out, "{v}").expect("writing to a Vec cannot fail");
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.0.float(v);
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        crate::write_string(v, &mut self.0.out);
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let writer = self.0;
        writer.out.push(b'[');
        let mut first = true;
        loop {
            let mark = writer.out.len();
            if !first {
                writer.out.push(b',');
            }
            if seq.next_element_seed(Node(&mut *writer))?.is_none() {
                writer.out.truncate(mark);
                break;
            }
            first = false;
        }
        writer.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let writer = self.0;
        let (start, keys_start) = (writer.out.len(), writer.keys.len());
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(Key(&mut writer.keys))? {
            let at = writer.out.len();
            map.next_value_seed(Node(&mut *writer))?;
            entries.push(Entry {
                key,
                value: at..writer.out.len(),
            });
        }
        writer.close_object(start, keys_start, entries);
        Ok(())
    }
}

/// An object's key, appended to the open objects' keys; yields where it lies.
struct Key<'k>(&'k mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = Range<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Range<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Key<'_> {
    type Value = Range<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Range<usize>, E> {
        let start = self.0.len();
        self.0.extend_from_slice(v.as_bytes());
        Ok(start..self.0.len())
    }
}

#[cfg(test)]
mod tests;
