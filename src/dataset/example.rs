//! `tf.train.Example` records: the payload and label features of one serialized Example, found
//! without copying or allocating by the record's bytes.
//!
//! The wire format (protobuf, `tensorflow/core/example/{example,feature}.proto`):
//! ```text
//! Example  { Features features = 1; }
//! Features { map<string, Feature> feature = 1; }   // entries: { string key = 1; Feature value = 2; }
//! Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }   Int64List { repeated int64 value = 1 [packed]; }
//! ```
//! Every length is checked against the bytes that remain before it is used, varints are at most
//! ten bytes, unknown fields are skipped by their wire type, and a key that appears twice takes
//! its last value (protobuf's map semantics). Nothing here allocates by a length read from the
//! record: the payload is a range of the record's own bytes.

#![forbid(unsafe_code)]

use std::ops::Range;

/// What to take from each Example: the payload feature (a `bytes_list`; its first value becomes
/// the sample) and the label feature (an `int64_list`; its first value, minus `label_offset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExampleSpec {
    /// The `bytes_list` feature whose first value is the sample.
    pub payload: String,
    /// `None`: no label (−1).
    pub label: Option<String>,
    /// Subtracted from the label read (TensorFlow's ImageNet converter writes 1..=1000).
    pub label_offset: i64,
}

/// The payload's place in the record's data and the label (`None` when the record has no label
/// feature or none was asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Where the payload lies in the record's data.
    pub payload: Range<usize>,
    /// The label (minus `label_offset`), `None` without one.
    pub label: Option<i64>,
}

/// Protobuf wire types.
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// A cursor over protobuf bytes that never reads past its end.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the whole record (so ranges are the record's).
    base: usize,
}

impl<'a> Wire<'a> {
    fn new(buf: &'a [u8], base: usize) -> Wire<'a> {
        Wire { buf, pos: 0, base }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err("a varint runs past the end of its message".into());
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint is longer than 10 bytes".into())
    }

    /// The next field's number and wire type.
    fn tag(&mut self) -> Result<(u64, u8), String> {
        let t = self.varint()?;
        let field = t >> 3;
        if field == 0 {
            return Err("field number 0".into());
        }
        Ok((field, (t & 7) as u8))
    }

    /// A length-delimited field's bytes, as a cursor and as a range of the record.
    fn len_delimited(&mut self) -> Result<(Wire<'a>, Range<usize>), String> {
        let n = self.varint()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(format!(
                "a field of {n} bytes runs past the end of its message ({left} bytes left)"
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        let range = self.base + start..self.base + self.pos;
        Ok((
            Wire::new(&self.buf[start..self.pos], self.base + start),
            range,
        ))
    }

    fn skip(&mut self, wire: u8) -> Result<(), String> {
        let fixed = match wire {
            VARINT => return self.varint().map(drop),
            LEN => return self.len_delimited().map(drop),
            I64 => 8,
            I32 => 4,
            w => {
                return Err(format!(
                    "unsupported wire type {w} (groups are not used here)"
                ))
            }
        };
        if self.buf.len() - self.pos < fixed {
            return Err("a fixed-width field runs past the end of its message".into());
        }
        self.pos += fixed;
        Ok(())
    }
}

/// A feature's value, as far as we use it.
enum Value {
    /// The first value of a `bytes_list` (`None`: the list is empty).
    Bytes(Option<Range<usize>>),
    /// The first value of an `int64_list`.
    Int(Option<i64>),
    Float,
    /// A feature with no kind set.
    Unset,
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Bytes(_) => "bytes_list",
            Value::Int(_) => "int64_list",
            Value::Float => "float_list",
            Value::Unset => "empty feature",
        }
    }
}

fn feature(mut w: Wire<'_>) -> Result<Value, String> {
    let mut v = Value::Unset;
    while !w.done() {
        let (field, wire) = w.tag()?;
        match (field, wire) {
            (1, LEN) => {
                let (mut list, _) = w.len_delimited()?;
                let mut first = None;
                while !list.done() {
                    let (f, t) = list.tag()?;
                    if (f, t) == (1, LEN) {
                        let (_, r) = list.len_delimited()?;
                        first.get_or_insert(r);
                    } else {
                        list.skip(t)?;
                    }
                }
                v = Value::Bytes(first);
            }
            (2, LEN) => {
                w.len_delimited()?;
                v = Value::Float;
            }
            (3, LEN) => {
                let (mut list, _) = w.len_delimited()?;
                let mut first = None;
                while !list.done() {
                    match list.tag()? {
                        // Packed (the usual encoding): varints back to back.
                        (1, LEN) => {
                            let (mut packed, _) = list.len_delimited()?;
                            while !packed.done() {
                                let x = packed.varint()? as i64;
                                first.get_or_insert(x);
                            }
                        }
                        // Unpacked: parsers must accept it too.
                        (1, VARINT) => {
                            let x = list.varint()? as i64;
                            first.get_or_insert(x);
                        }
                        (_, t) => list.skip(t)?,
                    }
                }
                v = Value::Int(first);
            }
            (_, t) => w.skip(t)?,
        }
    }
    Ok(v)
}

/// Calls `f(key, value)` for every feature entry of the serialized Example `data`, in wire
/// order (`key` a range of `data`; `value` the `Feature` message, if the entry has one).
fn each_feature<'a>(
    data: &'a [u8],
    mut f: impl FnMut(Range<usize>, Option<Wire<'a>>) -> Result<(), String>,
) -> Result<(), String> {
    let mut w = Wire::new(data, 0);
    while !w.done() {
        let (field, wire) = w.tag()?;
        if (field, wire) != (1, LEN) {
            w.skip(wire)?;
            continue;
        }
        // Features (may appear more than once: protobuf merges them).
        let (mut features, _) = w.len_delimited()?;
        while !features.done() {
            let (f_no, t) = features.tag()?;
            if (f_no, t) != (1, LEN) {
                features.skip(t)?;
                continue;
            }
            let (mut entry, _) = features.len_delimited()?;
            let mut key: Option<Range<usize>> = None;
            let mut value: Option<Wire<'a>> = None;
            while !entry.done() {
                match entry.tag()? {
                    (1, LEN) => key = Some(entry.len_delimited()?.1),
                    (2, LEN) => value = Some(entry.len_delimited()?.0),
                    (_, t) => entry.skip(t)?,
                }
            }
            f(key.unwrap_or(0..0), value)?;
        }
    }
    Ok(())
}

/// Finds `spec`'s features in the serialized Example `data`. The error says what was wrong
/// (malformed, the payload feature missing — naming the features present — or of another kind).
/// Nothing is allocated unless the payload feature is missing.
pub fn find(data: &[u8], spec: &ExampleSpec) -> Result<Found, String> {
    let mut payload: Option<Value> = None;
    let mut label: Option<Value> = None;
    each_feature(data, |key, value| {
        let name = &data[key];
        let is_payload = name == spec.payload.as_bytes();
        let is_label = spec.label.as_deref().is_some_and(|l| name == l.as_bytes());
        if is_payload || is_label {
            let v = match value {
                Some(v) => feature(v)?,
                None => Value::Unset,
            };
            if is_payload {
                payload = Some(v);
            } else {
                label = Some(v);
            }
        }
        Ok(())
    })?;
    let payload = match payload {
        Some(Value::Bytes(Some(r))) => r,
        Some(Value::Bytes(None)) => {
            return Err(format!("feature {:?} has no value", spec.payload));
        }
        Some(other) => {
            return Err(format!(
                "feature {:?} is a {}, not a bytes_list",
                spec.payload,
                other.kind()
            ));
        }
        None => {
            // The error path only: name (up to 16 of) the features the record has.
            let mut others: Vec<String> = Vec::new();
            each_feature(data, |key, _| {
                if others.len() < 16 {
                    others.push(format!("{:?}", String::from_utf8_lossy(&data[key])));
                }
                Ok(())
            })?;
            return Err(format!(
                "no feature {:?} in this tf.train.Example (it has {})",
                spec.payload,
                if others.is_empty() {
                    "no features".to_string()
                } else {
                    others.join(", ")
                }
            ));
        }
    };
    let label = match label {
        None | Some(Value::Int(None)) => None,
        // -1 is "no label": a label the offset would take below 0 is refused, not turned into
        // it (or wrapped).
        Some(Value::Int(Some(x))) => match x.checked_sub(spec.label_offset) {
            Some(v) if v >= 0 || spec.label_offset == 0 => Some(v),
            _ => {
                return Err(format!(
                    "label {x} (feature {:?}) is below label_offset {}",
                    spec.label.as_deref().unwrap_or(""),
                    spec.label_offset
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "label feature {:?} is a {}, not an int64_list",
                spec.label.as_deref().unwrap_or(""),
                other.kind()
            ));
        }
    };
    Ok(Found { payload, label })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn len_field(field: u64, body: &[u8], out: &mut Vec<u8>) {
        varint(field << 3 | 2, out);
        varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }

    /// A hand-encoded Example: `image/encoded` bytes, `image/class/label` int64 (packed or not),
    /// plus a float feature to skip.
    fn example(payload: &[u8], label: i64, packed: bool) -> Vec<u8> {
        let mut bytes_list = Vec::new();
        len_field(1, payload, &mut bytes_list);
        let mut f_bytes = Vec::new();
        len_field(1, &bytes_list, &mut f_bytes);
        let mut int_list = Vec::new();
        if packed {
            let mut p = Vec::new();
            varint(label as u64, &mut p);
            len_field(1, &p, &mut int_list);
        } else {
            varint(1 << 3, &mut int_list);
            varint(label as u64, &mut int_list);
        }
        let mut f_int = Vec::new();
        len_field(3, &int_list, &mut f_int);
        let mut f_float = Vec::new();
        len_field(2, &[0x0d, 0, 0, 0x80, 0x3f], &mut f_float); // value: 1.0f (unpacked)
        let mut features = Vec::new();
        for (k, v) in [
            ("image/format", &f_float),
            ("image/encoded", &f_bytes),
            ("image/class/label", &f_int),
        ] {
            let mut entry = Vec::new();
            len_field(1, k.as_bytes(), &mut entry);
            len_field(2, v, &mut entry);
            len_field(1, &entry, &mut features);
        }
        let mut ex = Vec::new();
        len_field(1, &features, &mut ex);
        ex
    }

    fn spec() -> ExampleSpec {
        ExampleSpec {
            payload: "image/encoded".into(),
            label: Some("image/class/label".into()),
            label_offset: 0,
        }
    }

    #[test]
    fn finds_payload_and_label_packed_or_not() {
        for packed in [true, false] {
            for label in [0i64, 7, 1000, -3] {
                let ex = example(b"\xff\xd8jpeg bytes\xff\xd9", label, packed);
                let f = find(&ex, &spec()).unwrap();
                assert_eq!(&ex[f.payload.clone()], b"\xff\xd8jpeg bytes\xff\xd9");
                assert_eq!(f.label, Some(label));
            }
        }
        let f = find(
            &example(b"x", 5, true),
            &ExampleSpec {
                label_offset: 1,
                ..spec()
            },
        )
        .unwrap();
        assert_eq!(f.label, Some(4));
        // Below the offset (it would read as -1, "no label"), or where the subtraction would
        // wrap: refused, naming the label.
        for label in [0, i64::MIN] {
            let e = find(
                &example(b"x", label, true),
                &ExampleSpec {
                    label_offset: 1,
                    ..spec()
                },
            )
            .unwrap_err();
            assert!(e.contains(&format!("label {label}")) && e.contains("below label_offset 1"));
        }
    }

    #[test]
    fn missing_or_mistyped_features_are_named() {
        let ex = example(b"x", 1, true);
        let e = find(
            &ex,
            &ExampleSpec {
                payload: "image/raw".into(),
                ..spec()
            },
        )
        .unwrap_err();
        assert!(
            e.contains("no feature \"image/raw\"") && e.contains("image/format"),
            "{e}"
        );
        let e = find(
            &ex,
            &ExampleSpec {
                payload: "image/class/label".into(),
                label: None,
                label_offset: 0,
            },
        )
        .unwrap_err();
        assert!(e.contains("int64_list, not a bytes_list"), "{e}");
        let e = find(
            &ex,
            &ExampleSpec {
                label: Some("image/encoded".into()),
                payload: "image/format".into(),
                label_offset: 0,
            },
        )
        .unwrap_err();
        assert!(e.contains("float_list"), "{e}");
        // No label feature: no label, not an error.
        let f = find(
            &ex,
            &ExampleSpec {
                label: Some("nope".into()),
                ..spec()
            },
        )
        .unwrap();
        assert_eq!(f.label, None);
    }

    /// Every truncation and every single-byte change of a valid Example parses or fails with a
    /// message; a payload found always lies inside the record.
    #[test]
    fn damaged_examples_never_panic_or_escape_the_record() {
        let ex = example(&[7u8; 300], 3, true);
        for cut in 0..ex.len() {
            if let Ok(f) = find(&ex[..cut], &spec()) {
                assert!(f.payload.end <= cut);
            }
        }
        for i in 0..ex.len() {
            for x in [0x00u8, 0x7f, 0x80, 0xff, ex[i] ^ 0x04] {
                let mut bad = ex.clone();
                bad[i] = x;
                if let Ok(f) = find(&bad, &spec()) {
                    assert!(f.payload.end <= bad.len());
                }
            }
        }
        assert!(find(&[0xff; 11], &spec()).unwrap_err().contains("varint"));
        assert!(find(b"", &spec()).unwrap_err().contains("no feature"));
    }
}
