//! The text written while reading is the tree's text, byte for byte: random documents in
//! many spellings (key order, keys given twice or escaped, numbers in every form, deep
//! nesting) against `serde_json::Value` and [`crate::canonical_json`].

use proptest::prelude::*;
use serde_json::Value;

use super::{JsonText, write_canonical_text};
use crate::canonical_json;
use crate::tests::json;

/// What the tree gives for `text`: its compact text and its canonical text, or `None` if
/// it is not JSON.
fn by_tree(text: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(text).ok()?;
    Some((value.to_string(), canonical_json(&value)))
}

/// What the writers give for `text`, in the same form.
fn by_text(text: &str) -> Option<(String, String)> {
    let compact = serde_json::from_str::<JsonText>(text).ok()?.into_string();
    let mut canonical = b"kept:".to_vec();
    write_canonical_text(text, &mut canonical).ok()?;
    let canonical = String::from_utf8(canonical).unwrap();
    let canonical = canonical
        .strip_prefix("kept:")
        .expect("appended")
        .to_owned();
    Some((compact, canonical))
}

fn assert_same(text: &str) {
    assert_eq!(by_text(text), by_tree(text), "{text}");
}

/// Number spellings, the awkward ones included: negative zero, exponents, integers past
/// u64 and i64 (floats then), floats that print long.
fn number() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "0",
        "-0",
        "-0.0",
        "1.0",
        "1e5",
        "1E2",
        "-1.5e-3",
        "0.1e1",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "1e308",
        "123456789012345678901234567890",
        "9007199254740993",
        "9007199254740992.0",
        "4.9e-324",
        "1e16",
        "1e15",
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        fixed,
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
    ]
}

/// String spellings: escapes that decode to the same text as plain characters do.
fn string() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        r#""a""#,
        r#""\u0061""#,
        r#""\/""#,
        r#""\ud83d\ude00""#,
        r#""tab\t""#,
        r#""é""#,
        r#""\u0000""#,
        r#""\"""#,
        r#""""#,
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        fixed,
        ".{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap())
    ]
}

/// A JSON document as a client might spell it: objects with keys out of order, given
/// twice, or escaped (`"\u0061"` is `"a"`), and spaces here and there.
fn document() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        number(),
        string(),
        prop::sample::select(vec!["null", "true", "false"]).prop_map(str::to_owned),
    ];
    let key = prop::sample::select(vec![
        r#""a""#,
        r#""\u0061""#,
        r#""b""#,
        r#""B""#,
        r#""""#,
        r#""é""#,
        r#""\n""#,
        r#""aa""#,
    ]);
    leaf.prop_recursive(5, 64, 6, move |inner| {
        let spaced = any::<bool>();
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..6), spaced).prop_map(|(items, spaced)| {
                let sep = if spaced { " ,\n " } else { "," };
                format!("[{}]", items.join(sep))
            }),
            (prop::collection::vec((key.clone(), inner), 0..6), spaced).prop_map(
                |(entries, spaced)| {
                    let (sep, colon) = if spaced { (" , ", " : ") } else { (",", ":") };
                    let entries: Vec<String> = entries
                        .iter()
                        .map(|(k, v)| format!("{k}{colon}{v}"))
                        .collect();
                    format!("{{{}}}", entries.join(sep))
                }
            ),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn a_spelled_document_writes_the_text_of_its_tree(text in document()) {
        let tree = by_tree(&text);
        prop_assert!(tree.is_some(), "generated text is JSON: {}", text);
        prop_assert_eq!(by_text(&text), tree, "{}", text);
    }

    #[test]
    fn a_value_in_any_layout_writes_the_text_of_its_tree(x in json()) {
        for text in [x.to_string(), serde_json::to_string_pretty(&x).unwrap()] {
            prop_assert_eq!(by_text(&text), by_tree(&text), "{}", text);
        }
    }

    #[test]
    fn any_text_is_json_for_both_or_for_neither(text in ".{0,24}") {
        prop_assert_eq!(by_text(&text), by_tree(&text), "{}", text);
    }
}

#[test]
fn keys_are_sorted_by_their_decoded_bytes_and_the_last_of_a_repeated_key_wins() {
    let text = r#"{"b": 1, "\u0061": [2, {"z": 0, "y": 1.50}], "a": 3, "é": null, "B": true}"#;
    assert_same(text);
    assert_eq!(
        serde_json::from_str::<JsonText>(text).unwrap().as_str(),
        r#"{"B":true,"a":3,"b":1,"é":null}"#
    );
    let mut canonical = Vec::new();
    write_canonical_text(r#"{"y": 1.0, "x": [1e2, 2.5, -0]}"#, &mut canonical).unwrap();
    assert_eq!(
        String::from_utf8(canonical).unwrap(),
        r#"{"x":[100,2.5,0],"y":1}"#
    );
}

#[test]
fn text_that_is_not_json_leaves_the_output_as_it_was() {
    for text in ["", "abc", "1 2", "{\"a\":", "[1,]", "1e400", "\"\\x\""] {
        let mut out = b"before".to_vec();
        assert!(write_canonical_text(text, &mut out).is_err(), "{text}");
        assert_eq!(out, b"before", "{text}");
        assert_same(text);
    }
}

/// `serde_json` refuses a document nested past 128 levels: the writers refuse the same
/// ones (and so hold at most that many open objects).
#[test]
fn nesting_is_limited_as_for_the_tree() {
    for depth in [126, 127, 128, 129, 1_000] {
        let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_same(&text);
        let text = format!("{}1{}", "{\"k\":".repeat(depth), "}".repeat(depth));
        assert_same(&text);
    }
}
