//! Every key a configuration file may have, read from the serde types that read the file
//! (`config::raw`'s, and each module's) rather than kept by hand: where a key belongs when it is
//! written in the wrong table (`config::raw`'s unknown-key hints), and the test that
//! `docs/configuration.md` documents each one.
//!
//! [`of`] walks a type as serde would walk a file that had every key. Each table's keys are
//! serde's own list: the `fields` a derived type passes to `deserialize_struct`, or, for a
//! table read through a hand-written deserialiser that accepts a table or a value (`compress`,
//! `auth_basic`), the `expected` list of the unknown-key error it gives for a key it does not
//! have. Each key's value is then walked in turn. A value the walk can't make up (a duration,
//! a core list, a required key left out) fails that pass; the key is left out of the next one,
//! as `config::raw` leaves out a file's wrong keys, until the whole type deserialises.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Deserialize;
use serde::de::value::{BorrowedStrDeserializer, U64Deserializer};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A table's keys, by the table's shape: its dotted path from the top with a map's key as
/// `NAME` and a list's element as `[]` (`upstream.NAME.backends[]`); `""` is the top level.
/// Lists of tables written with `[[…]]` (`listener`, `route`) are written without `[]`, as a
/// `[[listener.route]]` header names them.
pub(crate) type Tables = BTreeMap<String, Vec<&'static str>>;

/// The most passes a walk takes: each leaves out one more key or learns one more table.
const MAX_PASSES: usize = 2_000;

/// Every table of `T` and its keys, in the order serde lists them.
pub(crate) fn of<'de, T: Deserialize<'de>>() -> Tables {
    let walk = Walk::default();
    for _ in 0..MAX_PASSES {
        walk.failed.replace(false);
        if T::deserialize(Tracer::new(&walk, String::new())).is_ok() {
            break;
        }
    }
    walk.tables.into_inner()
}

/// The shape of the table at `path` as [`Tables`] writes it.
pub(crate) fn shape(path: &str) -> String {
    path.replace("listener[]", "listener")
        .replace("route[]", "route")
}

/// What one walk has learnt so far, over its passes.
#[derive(Default)]
struct Walk {
    tables: RefCell<Tables>,
    /// Values (by path) that failed a pass, left out of the next.
    left_out: RefCell<BTreeSet<String>>,
    /// The keys of tables read through a hand-written deserialiser, by path.
    probed: RefCell<BTreeMap<String, &'static [&'static str]>>,
    /// Whether this pass's failure has been put down to a value already: the innermost key
    /// whose value failed is the one left out, not the tables around it.
    failed: Cell<bool>,
}

impl Walk {
    fn record(&self, path: &str, fields: &'static [&'static str]) {
        let mut tables = self.tables.borrow_mut();
        let keys = tables.entry(shape(path)).or_default();
        for field in fields {
            if !keys.contains(field) {
                keys.push(field);
            }
        }
    }

    /// A value at `path` failed: the first one of a pass is left out from the next.
    fn fail(&self, path: &str) {
        if !self.failed.replace(true) {
            self.left_out.borrow_mut().insert(path.to_string());
        }
    }
}

/// The walk's error: why a value could not be made up, or a hand-written table's keys.
#[derive(Debug)]
enum Error {
    Failed,
    Fields(&'static [&'static str]),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Error::Failed => f.write_str("no value here"),
            Error::Fields(fields) => write!(f, "a table of the keys {fields:?}"),
        }
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Error::Failed
    }

    fn unknown_field(_: &str, expected: &'static [&'static str]) -> Self {
        Error::Fields(expected)
    }
}

/// Stands in for the value at `path`.
struct Tracer<'w> {
    walk: &'w Walk,
    path: String,
}

impl<'w> Tracer<'w> {
    fn new(walk: &'w Walk, path: String) -> Self {
        Tracer { walk, path }
    }

    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

/// Serde's prefix for the names of `Spanned`'s own struct and keys, which no file has: a
/// spanned value is walked as the value itself.
const SPANNED: &str = "$__serde_spanned_private";

impl<'de, 'w> Deserializer<'de> for Tracer<'w> {
    type Error = Error;

    /// A value of no declared shape: offered as a table with a key no table has, whose error
    /// lists a derived table's keys (walked on the next pass); anything else fails here.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let known = self.walk.probed.borrow().get(&self.path).copied();
        match known {
            Some(fields) => {
                self.walk.record(&self.path, fields);
                visitor.visit_map(Fields::new(self, fields))
            }
            None => visitor.visit_map(Probe {
                tracer: self,
                asked: false,
            }),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name.starts_with(SPANNED) {
            return visitor.visit_map(Spanned {
                tracer: Some(self),
                fields,
                at: 0,
            });
        }
        self.walk.record(&self.path, fields);
        visitor.visit_map(Fields::new(self, fields))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_map(Entry { tracer: Some(self) })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = format!("{}[]", self.path);
        visitor.visit_seq(Element {
            tracer: Some(Tracer::new(self.walk, path)),
        })
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_bool(false)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str("")
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_i64(0)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(0)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_f64(0.0)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u128 f32 char bytes byte_buf unit unit_struct
        newtype_struct tuple tuple_struct enum identifier ignored_any
    }
}

/// A derived table's keys, each with its value walked, less those left out.
struct Fields<'w> {
    tracer: Tracer<'w>,
    keys: std::vec::IntoIter<&'static str>,
    value: Option<String>,
}

impl<'w> Fields<'w> {
    fn new(tracer: Tracer<'w>, fields: &'static [&'static str]) -> Self {
        let left_out = tracer.walk.left_out.borrow();
        let keys: Vec<_> = fields
            .iter()
            .copied()
            .filter(|f| !left_out.contains(&tracer.child(f)))
            .collect();
        drop(left_out);
        Fields {
            tracer,
            keys: keys.into_iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(key) = self.keys.next() else {
            return Ok(None);
        };
        self.value = Some(self.tracer.child(key));
        seed.deserialize(BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let path = self.value.take().unwrap_or_default();
        seed.deserialize(Tracer::new(self.tracer.walk, path.clone()))
            .inspect_err(|_| self.tracer.walk.fail(&path))
    }
}

/// A map of the user's own keys (`[upstream.NAME]`, `env`): one entry, `NAME`.
struct Entry<'w> {
    tracer: Option<Tracer<'w>>,
}

impl<'de> MapAccess<'de> for Entry<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if self.tracer.is_none() {
            return Ok(None);
        }
        seed.deserialize(BorrowedStrDeserializer::new("NAME"))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let tracer = self.tracer.take().ok_or(Error::Failed)?;
        let path = tracer.child("NAME");
        seed.deserialize(Tracer::new(tracer.walk, path))
    }
}

/// A list: one element.
struct Element<'w> {
    tracer: Option<Tracer<'w>>,
}

impl<'de> SeqAccess<'de> for Element<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.tracer.take() {
            Some(tracer) => seed.deserialize(tracer).map(Some),
            None => Ok(None),
        }
    }
}

/// `Spanned<T>`: a span of 0 and the value walked in place.
struct Spanned<'w> {
    tracer: Option<Tracer<'w>>,
    fields: &'static [&'static str],
    /// The key whose value comes next.
    at: usize,
}

impl<'de> MapAccess<'de> for Spanned<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.fields.get(self.at) {
            Some(key) => seed
                .deserialize(BorrowedStrDeserializer::new(key))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let key = self.fields.get(self.at).ok_or(Error::Failed)?;
        self.at += 1;
        if key.ends_with("value") {
            let tracer = self.tracer.take().ok_or(Error::Failed)?;
            seed.deserialize(tracer)
        } else {
            seed.deserialize(U64Deserializer::new(0))
        }
    }
}

/// A value of no declared shape, offered as a table with one key that no table has.
struct Probe<'w> {
    tracer: Tracer<'w>,
    asked: bool,
}

impl<'de> MapAccess<'de> for Probe<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if std::mem::replace(&mut self.asked, true) {
            return Ok(None);
        }
        match seed.deserialize(BorrowedStrDeserializer::new("\u{1}")) {
            Err(Error::Fields(fields)) => {
                // A derived table: its keys are walked on the next pass. Not a failure of
                // this value, so nothing is left out for it.
                self.tracer
                    .walk
                    .probed
                    .borrow_mut()
                    .insert(self.tracer.path.clone(), fields);
                self.tracer.walk.failed.replace(true);
                Err(Error::Fields(fields))
            }
            other => other.map(Some),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, _: V) -> Result<V::Value, Error> {
        // A map of any keys (an untagged enum's buffer): a value, not a table of keys.
        Err(Error::Failed)
    }
}
