//! Counting the values of a msgpack payload without building them: a built value
//! costs tens of bytes against one on the wire (a `nil`), so the decoder refuses a
//! payload of too many values before building anything.

/// How many msgpack values `buf` holds (containers count themselves and
/// their elements), stopping with `Err(n)` as soon as `n > max`. Cut-short
/// or invalid bytes end the count where they start: the decoder then reports
/// them in its own words.
pub(crate) fn values_in(buf: &[u8], max: usize) -> Result<usize, usize> {
    let mut at = 0usize;
    let mut pending: usize = 1;
    let mut seen = 0usize;
    while pending > 0 {
        let Some(&m) = buf.get(at) else {
            break;
        };
        at += 1;
        pending -= 1;
        seen += 1;
        if seen > max {
            return Err(seen);
        }
        // (bytes of payload after the marker and its length, elements)
        let (skip, elements) = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0..=0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * usize::from(m & 0x0f)),
            0x90..=0x9f => (0, usize::from(m & 0x0f)),
            0xa0..=0xbf => (usize::from(m & 0x1f), 0),
            0xc4 | 0xd9 => (len(buf, &mut at, 1), 0),
            0xc5 | 0xda => (len(buf, &mut at, 2), 0),
            0xc6 | 0xdb => (len(buf, &mut at, 4), 0),
            0xc7 => (len(buf, &mut at, 1).saturating_add(1), 0),
            0xc8 => (len(buf, &mut at, 2).saturating_add(1), 0),
            0xc9 => (len(buf, &mut at, 4).saturating_add(1), 0),
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, len(buf, &mut at, 2)),
            0xdd => (0, len(buf, &mut at, 4)),
            0xde => (0, len(buf, &mut at, 2).saturating_mul(2)),
            0xdf => (0, len(buf, &mut at, 4).saturating_mul(2)),
        };
        at = at.saturating_add(skip);
        pending = pending.saturating_add(elements);
    }
    Ok(seen)
}

/// The big-endian length of `n` bytes at `at`, moving past it (0 when cut
/// short: the count then ends at the end of the buffer).
fn len(buf: &[u8], at: &mut usize, n: usize) -> usize {
    let Some(bytes) = buf.get(*at..*at + n) else {
        *at = buf.len();
        return 0;
    };
    *at += n;
    bytes
        .iter()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rmpv::Value;

    fn nodes(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(nodes).sum(),
            Value::Map(m) => m.iter().map(|(k, v)| nodes(k) + nodes(v)).sum(),
            _ => 0,
        }
    }

    fn encode(v: &Value) -> Vec<u8> {
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, v).unwrap();
        buf
    }

    #[test]
    fn a_claimed_array_of_nils_is_refused_at_the_cap() {
        // [0, array32 of 67M elements] followed by nils: one byte each.
        let mut buf = vec![0x92, 0x00, 0xdd, 0x03, 0xff, 0xff, 0xf0];
        buf.extend(std::iter::repeat_n(0xc0, 100_000));
        assert_eq!(values_in(&buf, 1000), Err(1001));
        // Cut short, the count ends with the bytes.
        assert_eq!(values_in(&buf, usize::MAX), Ok(3 + 100_000));
    }

    #[test]
    fn every_kind_of_value_is_counted_once() {
        let v = Value::Array(vec![
            Value::from(1.5f64),
            Value::from(1.5f32),
            Value::from(-3),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::from("BlockStored"),
            Value::from("x".repeat(300)),
            Value::Binary(vec![7; 70_000]),
            Value::Ext(5, vec![1, 2, 3, 4]),
            Value::Ext(5, vec![9; 300]),
            Value::Map(vec![(Value::from("k"), Value::Nil)]),
            Value::Boolean(true),
        ]);
        assert_eq!(values_in(&encode(&v), usize::MAX), Ok(nodes(&v)));
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            any::<bool>().prop_map(Value::Boolean),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,40}".prop_map(Value::from),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Value::Binary),
        ];
        leaf.prop_recursive(4, 64, 20, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..20).prop_map(Value::Array),
                proptest::collection::vec((inner.clone(), inner), 0..20).prop_map(Value::Map),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_count_is_the_trees(v in value()) {
            let buf = encode(&v);
            prop_assert_eq!(values_in(&buf, usize::MAX), Ok(nodes(&v)));
            let n = nodes(&v);
            prop_assert_eq!(values_in(&buf, n - 1), Err(n));
        }
    }
}
