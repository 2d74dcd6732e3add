//! The configuration's value types that more than one table has, with their deserialisers and the serialisers that write them back as read:
//! [`Dur`] (`"250ms"`, `"2s"`) and [`Size`] (`4096`, `"64KiB"`). Their errors say what was
//! expected, as serde reports them at the value's place.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A duration written as a string with a unit: "250ms", "2s", "1m".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl Dur {
    /// The longest duration any key accepts.
    const MAX: Duration = Duration::from_secs(365 * 86_400);
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string with a unit, such as \"250ms\", \"2s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                let d = humantime::parse_duration(s).map_err(|_| {
                    E::custom(format!(
                        "invalid duration \"{s}\", expected a number with a unit, such as \"250ms\", \"2s\" or \"1m\""
                    ))
                })?;
                // No timeout needs more, and a deadline of now plus any such duration cannot
                // overflow a clock: the request path adds them without checking.
                if d > Dur::MAX {
                    return Err(E::custom(format!(
                        "duration \"{s}\" is too long, expected at most 365 days"
                    )));
                }
                Ok(Dur(d))
            }
        }
        d.deserialize_str(V)
    }
}

/// As the file writes it, in seconds or milliseconds where that keeps it whole: `90s`,
/// `250ms`.
impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        match (d.subsec_nanos(), d.subsec_nanos() % 1_000_000) {
            (0, _) => write!(f, "{}s", d.as_secs()),
            (_, 0) => write!(f, "{}ms", d.as_millis()),
            _ => write!(f, "{}", humantime::format_duration(d)),
        }
    }
}

/// Written as read: its [`Display`](fmt::Display) text.
impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A size in bytes: `4096`, `"64KiB"`, `"1MiB"`, `"0"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a size such as 4096, \"64KiB\" or \"1MiB\"";
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("invalid size {v}, expected {EXPECTED}")))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                s.parse::<bytesize::ByteSize>()
                    .map(|b| Size(b.as_u64()))
                    .map_err(|_| E::custom(format!("invalid size \"{s}\", expected {EXPECTED}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// Written as a number of bytes: exact, and read back as it was.
impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}
