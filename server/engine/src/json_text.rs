//! A value's compact JSON text, byte for byte as `serde_json::to_vec`
//! writes it, and its length without writing it. A large payload is mostly
//! one long string, and serde_json escapes a string byte by byte: its
//! length, its offload check and its text were three such passes over each
//! large run input (8 % of the server's CPU at 1 MB payloads). Here the
//! bytes that need no escape, nearly all of them, are skipped 32 at a time
//! and copied whole (`bench/engine/json_text.rs`).

use serde_json::Value as Json;

/// The bytes a string's scan skips at once (a vector compare and an OR).
const LANES: usize = 32;

/// `value` as compact JSON text, exactly as `serde_json::to_vec` writes it.
pub fn to_vec(value: &Json) -> Vec<u8> {
    // room for the text as if nothing were escaped: counting the escapes
    // would cost a pass of its own where they are dense
    let mut unescaped = 0usize;
    add_len(value, &mut unescaped, usize::MAX, Escapes::Uncounted);
    let mut out = Vec::with_capacity(unescaped);
    write(value, &mut out);
    out
}

/// The length of [`to_vec`]'s text, without writing it.
pub fn len(value: &Json) -> usize {
    let mut total = 0usize;
    add_len(value, &mut total, usize::MAX, Escapes::Counted);
    total
}

/// Whether [`to_vec`]'s text is longer than `limit` bytes: counted only
/// until it is.
pub fn longer_than(value: &Json, limit: usize) -> bool {
    let mut total = 0usize;
    add_len(value, &mut total, limit, Escapes::Counted);
    total > limit
}

/// Whether [`add_len`] counts the bytes escapes add to strings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escapes {
    Counted,
    Uncounted,
}

/// Adds `value`'s text length to `total`, stopping once past `limit`.
fn add_len(value: &Json, total: &mut usize, limit: usize, escapes: Escapes) {
    if *total > limit {
        return;
    }
    // escapes only add: a string whose bytes alone pass the limit is not
    // scanned for them
    let counted = |text: &str, total: usize| {
        let unescaped = 2 + text.len();
        if escapes == Escapes::Uncounted || unescaped > limit.saturating_sub(total) {
            return unescaped;
        }
        string_len(text)
    };
    match value {
        Json::Null => *total += 4,
        Json::Bool(true) => *total += 4,
        Json::Bool(false) => *total += 5,
        Json::Number(number) => *total += number_len(number),
        Json::String(text) => *total += counted(text, *total),
        Json::Array(items) => {
            *total += 2 + items.len().saturating_sub(1);
            for item in items {
                add_len(item, total, limit, escapes);
            }
        }
        Json::Object(map) => {
            *total += 2 + map.len().saturating_sub(1);
            for (key, item) in map {
                *total += counted(key, *total) + 1;
                add_len(item, total, limit, escapes);
            }
        }
    }
}

fn write(value: &Json, out: &mut Vec<u8>) {
    match value {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(number) => {
            // a Vec takes every write
            let _ = serde_json::to_writer(&mut *out, number);
        }
        Json::String(text) => write_string(text, out),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Json::Object(map) => {
            out.push(b'{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write(item, out);
            }
            out.push(b'}');
        }
    }
}

/// The length of a number as serde_json writes it: written on the stack
/// (an array of floats is a large payload too).
fn number_len(number: &serde_json::Number) -> usize {
    let mut room = [0u8; 64];
    let mut text = std::io::Cursor::new(&mut room[..]);
    match serde_json::to_writer(&mut text, number) {
        Ok(()) => usize::try_from(text.position()).unwrap_or(usize::MAX),
        // longer than any f64 or integer: an arbitrary-precision one
        Err(_) => number.to_string().len(),
    }
}

/// A string's quoted, escaped length.
fn string_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut total = 2 + bytes.len();
    for lane in bytes.chunks(LANES) {
        if is_clean(lane) {
            continue;
        }
        // summed without a branch: where escapes are dense, a branch on
        // each byte would guess wrong at every other one
        total += lane
            .iter()
            .map(|&b| usize::from(EXTRA[usize::from(b)]))
            .sum::<usize>();
    }
    total
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    let bytes = text.as_bytes();
    out.push(b'"');
    let mut clean_from = 0;
    for_each_escape(bytes, |at, byte| {
        if clean_from < at {
            out.extend_from_slice(&bytes[clean_from..at]);
        }
        write_escape(byte, out);
        clean_from = at + 1;
    });
    out.extend_from_slice(&bytes[clean_from..]);
    out.push(b'"');
}

/// Calls `found` with the index and value of each byte of `bytes` that
/// needs an escape, in order. A run of [`LANES`] bytes with none is passed
/// over with one vector compare; one with some is read byte by byte, as
/// serde_json reads every byte, so text dense with escapes costs no more.
fn for_each_escape(bytes: &[u8], mut found: impl FnMut(usize, u8)) {
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + LANES).min(bytes.len());
        let lane = &bytes[at..end];
        if lane.len() == LANES && is_clean(lane) {
            at = end;
            continue;
        }
        for (i, &byte) in lane.iter().enumerate() {
            if ESCAPES[usize::from(byte)] != 0 {
                found(at + i, byte);
            }
        }
        at = end;
    }
}

/// Whether no byte of `lane` needs an escape: no early exit, so the
/// compare vectorizes.
fn is_clean(lane: &[u8]) -> bool {
    !lane.iter().fold(false, |dirty, &b| dirty | needs_escape(b))
}

fn needs_escape(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// For each byte, the letter of its escape (`\n`, `\"`, ...; `u` for
/// `\u00XX`), or 0 for none: serde_json's table.
const ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x0c] = b'f';
    table[b'\n' as usize] = b'n';
    table[b'\r' as usize] = b'r';
    table[b'\t' as usize] = b't';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// For each byte, how many bytes its escape adds to it.
const EXTRA: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = match ESCAPES[byte] {
            0 => 0,
            b'u' => 5,
            _ => 1,
        };
        byte += 1;
    }
    table
};

/// Writes the escape serde_json writes for `byte` (one that needs one).
fn write_escape(byte: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match ESCAPES[usize::from(byte)] {
        b'u' => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(byte >> 4)],
            HEX[usize::from(byte & 0xf)],
        ]),
        letter => out.extend_from_slice(&[b'\\', letter]),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Strings rich in what needs escaping, and in what does not.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".*",
            "[\\x00-\\x1f\"\\\\a-z\u{e9}\u{1F600}]{0,80}",
            // past a chunk or two, with an escape anywhere in it
            "[a-z]{30,100}[\"\\\\\\n\\x01]?[a-z]{0,70}",
        ]
    }

    fn value() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            text().prop_map(Json::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                prop::collection::btree_map(text(), inner, 0..6)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_text_is_serde_jsons_to_the_byte(value in value()) {
            let expected = serde_json::to_vec(&value).expect("serializable");
            prop_assert_eq!(to_vec(&value), expected.clone());
            prop_assert_eq!(len(&value), expected.len());
            prop_assert!(longer_than(&value, expected.len() - 1));
            prop_assert!(!longer_than(&value, expected.len()));
        }
    }

    #[test]
    fn every_byte_that_needs_an_escape_gets_serde_jsons() {
        for byte in 0u8..=0x7f {
            let text = format!("{}a{}", "x".repeat(40), char::from(byte));
            let value = Json::String(text);
            assert_eq!(
                to_vec(&value),
                serde_json::to_vec(&value).unwrap(),
                "byte {byte:#x}"
            );
        }
    }

    #[test]
    fn a_long_string_is_written_whole() {
        let value = json!({ "blob": "ab\"c".repeat(50_000), "n": [1, 2.5, -3] });
        assert_eq!(to_vec(&value), serde_json::to_vec(&value).unwrap());
        assert_eq!(len(&value), serde_json::to_vec(&value).unwrap().len());
    }
}
