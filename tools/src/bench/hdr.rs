//! A latency histogram in the JSON report: HdrHistogram's standard V2 compressed encoding
//! (`encodeIntoCompressedByteBuffer` in Java, `V2DeflateSerializer` here) in base64, the form
//! HdrHistogram's log files and tools read. `bench merge` decodes and adds them, so merged
//! percentiles come from every sample, never from averaged percentiles.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2DeflateSerializer};
use serde::{Deserialize, Serializer};

/// The histogram as a base64 string of its compressed encoding.
pub fn encode(h: &Histogram<u64>) -> Result<String, String> {
    let mut bytes = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(STANDARD.encode(bytes))
}

/// A histogram back from [`encode`]'s string (or any HdrHistogram tool's V2 encoding,
/// compressed or not).
pub fn decode(s: &str) -> Result<Histogram<u64>, String> {
    let bytes = STANDARD
        .decode(s.trim())
        .map_err(|e| format!("not base64: {e}"))?;
    Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| format!("not an HdrHistogram V2 encoding: {e:?}"))
}

/// For `#[serde(with = "hdr")]` on a `Histogram<u64>` field.
pub fn serialize<S: Serializer>(h: &Histogram<u64>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&encode(h).map_err(serde::ser::Error::custom)?)
}

/// For `#[serde(with = "hdr")]` on a `Histogram<u64>` field.
pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Histogram<u64>, D::Error> {
    let s = String::deserialize(d)?;
    decode(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::new_histogram;

    #[test]
    fn a_histogram_survives_its_encoding_count_for_count() {
        let mut h = new_histogram().unwrap();
        for v in [1_000u64, 20_000, 20_000, 3_000_000, 59_000_000_000] {
            h.record(v).unwrap();
        }
        let back = decode(&encode(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.len(), 5);
        assert_eq!(back.value_at_quantile(0.99), h.value_at_quantile(0.99));
        assert!(decode("not base64!").is_err());
        assert!(decode(&STANDARD.encode(b"not a histogram")).is_err());
    }
}
