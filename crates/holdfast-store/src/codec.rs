//! [`decode`]: bincode 1 decoding, as `bincode::deserialize` does it, of bytes that may be corrupt or
//! hostile: the log's records here, and the peer protocol's frames, which carry the same entries.
//!
//! `bincode::deserialize` recurses once per level of a value's nesting and has no bound on it. Some of
//! what holdfast decodes nests without end: a `Command::Batch` holds commands, an `Outcome::Batch`
//! outcomes, and openraft's errors carry an `AnyError` whose source is another. Twelve bytes make one more
//! level of `Command::Batch`: 10,000 levels, a 120 KB frame, overflowed a release build's 2 MiB stack, and
//! a stack overflow aborts the process (found while writing the peer protocol's fuzz tests; holdfast-server's
//! `fuzz_peer.rs` keeps the input). So [`decode`] refuses a value nested deeper than [`DEPTH_MAX`], with an
//! error, before the stack runs out.
//!
//! It also bounds what a value's sequences and maps take in memory by the length of its encoding
//! ([`element_bytes_max`]). Decoding from a slice, bincode already checks a string's length against the
//! bytes left before it allocates; but an element can take many times its encoding in memory (an answer's
//! `Err(NodeError::NotLeader { leader: None })`, 9 bytes, is a `Result<Written, NodeError>` of 224), and
//! serde reserves up to 1 MiB for a sequence on the word of its encoded length alone. Here a sequence
//! reserves nothing ahead of its elements (it grows as they arrive), and the elements of all of a value's
//! sequences and maps together take at most [`element_bytes_max`] of its length: no allocation is larger
//! than twice that (a vector's growth), or than the bytes (a string).

use std::cell::Cell;
use std::fmt;

use bincode::Options;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// How deep a decoded value may nest: structs, enums, sequences, maps, options and tuples, each a level.
/// The deepest value holdfast sends or stores nests about 15 levels (a forwarded batch of writes'
/// answers); 64 keeps well clear of that and of the stack (in a debug build, 1,000 levels of
/// `Command::Batch` took less than a test thread's 2 MiB).
pub const DEPTH_MAX: usize = 64;

/// How many bytes of memory the elements of a value's sequences and maps may take, together, per byte of
/// its encoding, beyond [`ELEMENT_BYTES_FREE`]. holdfast's larger values take at most about 3 (a log
/// entry's commands, a membership's node sets, a forwarded batch of writes); the tests decode every kind
/// of value within this.
pub const ELEMENT_BYTES_PER_BYTE: usize = 8;

/// How many bytes of elements any value may take, whatever its length: small values may take more per
/// byte, up to 32 (a batch's 256 outcomes `Outcome::Withdrawn`, 4 bytes each on the wire, 128 in memory).
pub const ELEMENT_BYTES_FREE: usize = 1 << 20;

/// How many bytes of memory the elements of a value `len` bytes long may take: what [`decode`] allows.
pub fn element_bytes_max(len: usize) -> usize {
    len.saturating_mul(ELEMENT_BYTES_PER_BYTE).max(ELEMENT_BYTES_FREE)
}

/// Decodes `bytes` as `bincode::deserialize` does (fixed-width integers, trailing bytes allowed), but a
/// value nested deeper than [`DEPTH_MAX`], or whose sequences' and maps' elements would take more than
/// [`element_bytes_max`] of its length in memory, is an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> bincode::Result<T> {
    decode_within(bytes, element_bytes_max(bytes.len()))
}

/// [`decode`], with the elements' bytes bounded by `elements_bytes_max` instead.
pub fn decode_within<T: DeserializeOwned>(bytes: &[u8], elements_bytes_max: usize) -> bincode::Result<T> {
    let options = bincode::DefaultOptions::new().with_fixint_encoding().allow_trailing_bytes();
    let mut deserializer = bincode::Deserializer::from_slice(bytes, options);
    let budget = Cell::new(elements_bytes_max);
    T::deserialize(Nested {
        inner: &mut deserializer,
        bounds: Bounds { left: DEPTH_MAX, budget: &budget, elements: false },
    })
}

/// What a value being decoded may still take: `left` more levels of nesting below it, and `budget` bytes
/// of elements, shared by the whole value. `elements`: the value is a sequence or a map, whose parts are
/// elements that take from the budget (a struct's or a tuple's fields are inside it, already counted).
#[derive(Clone, Copy)]
struct Bounds<'b> {
    left: usize,
    budget: &'b Cell<usize>,
    elements: bool,
}

impl Bounds<'_> {
    /// The bounds of the parts of a compound value, or an error if there is no level left for them.
    fn below<E: de::Error>(self) -> Result<Self, E> {
        match self.left.checked_sub(1) {
            Some(left) => Ok(Bounds { left, ..self }),
            None => Err(E::custom(format_args!("a value nested more than {DEPTH_MAX} deep"))),
        }
    }

    /// Takes an element of type `T` from the budget, if the value is a sequence or a map; an error if it
    /// does not fit. At least a byte: a sequence of zero-sized elements takes no bytes to encode either,
    /// and would run on for as many as its length says.
    fn take<T, E: de::Error>(self) -> Result<(), E> {
        if !self.elements {
            return Ok(());
        }
        let size = std::mem::size_of::<T>().max(1);
        let left = self.budget.get().checked_sub(size);
        let left = left.ok_or_else(|| E::custom("a value whose elements take more memory than its length allows"))?;
        self.budget.set(left);
        Ok(())
    }
}

/// A deserializer, or a compound value's access to its parts, within `bounds`.
struct Nested<'b, D> {
    inner: D,
    bounds: Bounds<'b>,
}

/// A visitor or seed of a value within `bounds`.
struct Levels<'b, V> {
    inner: V,
    bounds: Bounds<'b>,
}

/// Forwards each method to the inner deserializer, with the visitor inside the bounds; `elements`: the
/// methods decode sequences or maps.
macro_rules! forward_deserialize {
    ($elements:literal; $($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                let bounds = Bounds { elements: $elements, ..self.bounds };
                self.inner.$method($($arg,)* Levels { inner: visitor, bounds })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Nested<'_, D> {
    type Error = D::Error;

    forward_deserialize! {
        false;
        deserialize_any();
        deserialize_bool();
        deserialize_i8();
        deserialize_i16();
        deserialize_i32();
        deserialize_i64();
        deserialize_i128();
        deserialize_u8();
        deserialize_u16();
        deserialize_u32();
        deserialize_u64();
        deserialize_u128();
        deserialize_f32();
        deserialize_f64();
        deserialize_char();
        deserialize_str();
        deserialize_string();
        deserialize_bytes();
        deserialize_byte_buf();
        deserialize_option();
        deserialize_unit();
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier();
        deserialize_ignored_any();
    }

    forward_deserialize! {
        true;
        deserialize_seq();
        deserialize_map();
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Levels<'_, V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(formatter)
    }

    forward_visit! {
        visit_bool(bool);
        visit_i8(i8);
        visit_i16(i16);
        visit_i32(i32);
        visit_i64(i64);
        visit_i128(i128);
        visit_u8(u8);
        visit_u16(u16);
        visit_u32(u32);
        visit_u64(u64);
        visit_u128(u128);
        visit_f32(f32);
        visit_f64(f64);
        visit_char(char);
        visit_str(&str);
        visit_borrowed_str(&'de str);
        visit_string(String);
        visit_bytes(&[u8]);
        visit_borrowed_bytes(&'de [u8]);
        visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let bounds = self.bounds.below()?;
        self.inner.visit_some(Nested { inner: deserializer, bounds })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let bounds = self.bounds.below()?;
        self.inner.visit_newtype_struct(Nested { inner: deserializer, bounds })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let bounds = self.bounds.below()?;
        self.inner.visit_seq(Nested { inner: seq, bounds })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let bounds = self.bounds.below()?;
        self.inner.visit_map(Nested { inner: map, bounds })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        let bounds = self.bounds.below()?;
        self.inner.visit_enum(Nested { inner: data, bounds })
    }
}

/// Each part of a compound value decodes within the bounds left below it.
impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Levels<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.deserialize(Nested { inner: deserializer, bounds: self.bounds })
    }
}

/// The elements of a sequence, each taken from the budget before it is decoded. No size hint: serde
/// would reserve room for up to 1 MiB of elements on the word of the encoded length alone.
impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Nested<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        if self.inner.size_hint() != Some(0) {
            self.bounds.take::<T::Value, A::Error>()?;
        }
        self.inner.next_element_seed(Levels { inner: seed, bounds: self.bounds })
    }
}

/// The entries of a map, each key and value taken from the budget before it is decoded.
impl<'de, A: MapAccess<'de>> MapAccess<'de> for Nested<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        if self.inner.size_hint() != Some(0) {
            self.bounds.take::<K::Value, A::Error>()?;
        }
        self.inner.next_key_seed(Levels { inner: seed, bounds: self.bounds })
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.bounds.take::<V::Value, A::Error>()?;
        self.inner.next_value_seed(Levels { inner: seed, bounds: self.bounds })
    }
}

impl<'b, 'de, A: EnumAccess<'de>> EnumAccess<'de> for Nested<'b, A> {
    type Error = A::Error;
    type Variant = Nested<'b, A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self::Variant), A::Error> {
        let bounds = self.bounds;
        let (value, variant) = self.inner.variant_seed(Levels { inner: seed, bounds })?;
        Ok((value, Nested { inner: variant, bounds }))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Nested<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.newtype_variant_seed(Levels { inner: seed, bounds: self.bounds })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let bounds = Bounds { elements: false, ..self.bounds };
        self.inner.tuple_variant(len, Levels { inner: visitor, bounds })
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let bounds = Bounds { elements: false, ..self.bounds };
        self.inner.struct_variant(fields, Levels { inner: visitor, bounds })
    }
}

#[cfg(test)]
mod tests {
    use holdfast_core::Command;
    use openraft::{Entry, EntryPayload};

    use super::*;
    use crate::TypeConfig;

    fn nested_batch(levels: usize) -> Vec<u8> {
        // Encoded by hand, level by level: building the value itself would recurse as deep to drop it.
        let inner = bincode::serialize(&Command::CloseSession { id: 1 }).unwrap();
        let batch = bincode::serialize(&Command::Batch(vec![Command::CloseSession { id: 1 }])).unwrap();
        // A batch of one command is its tag, a length of 1, then the command.
        let head = &batch[..batch.len() - inner.len()];
        let entry = Entry::<TypeConfig> {
            log_id: Default::default(),
            payload: EntryPayload::Normal(holdfast_core::Entry { at_ms: 1, cmd: Command::CloseSession { id: 1 } }),
        };
        let whole = bincode::serialize(&entry).unwrap();
        let mut bytes = whole[..whole.len() - inner.len()].to_vec();
        for _ in 0..levels {
            bytes.extend_from_slice(head);
        }
        bytes.extend_from_slice(&inner);
        bytes
    }

    #[test]
    fn a_value_decodes_as_bincode_decodes_it() {
        let bytes = nested_batch(3);
        let plain: Entry<TypeConfig> = bincode::deserialize(&bytes).unwrap();
        assert_eq!(decode::<Entry<TypeConfig>>(&bytes).unwrap(), plain);
        let trailing = [&bytes[..], b"after"].concat();
        assert_eq!(decode::<Entry<TypeConfig>>(&trailing).unwrap(), plain);
        assert_eq!(
            decode::<(u32, Option<String>)>(&bincode::serialize(&(7u32, Some("x"))).unwrap()).unwrap(),
            (7, Some("x".into()))
        );
    }

    #[test]
    fn elements_that_take_many_times_their_encoding_are_refused() {
        // A `None` is one byte; an `Option<u128>` takes 32 in memory.
        let nones = bincode::serialize(&vec![None::<u128>; 100_000]).unwrap();
        assert_eq!(bincode::deserialize::<Vec<Option<u128>>>(&nones).unwrap().len(), 100_000);
        let refused = decode::<Vec<Option<u128>>>(&nones).unwrap_err();
        assert!(refused.to_string().contains("more memory than its length allows"), "{refused}");
        // Within the budget: as many as bincode decodes; and a small value, whatever it takes per byte.
        let somes = bincode::serialize(&vec![Some(7u128); 100_000]).unwrap();
        assert_eq!(decode::<Vec<Option<u128>>>(&somes).unwrap(), vec![Some(7u128); 100_000]);
        let few = bincode::serialize(&vec![None::<u128>; 1_000]).unwrap();
        assert_eq!(decode::<Vec<Option<u128>>>(&few).unwrap(), vec![None; 1_000]);
    }

    #[test]
    fn a_sequence_of_zero_sized_elements_ends_at_the_budget_instead_of_running_on() {
        // `bincode::deserialize` would count to 2^64: each `()` takes no bytes to decode.
        let refused = decode::<Vec<()>>(&u64::MAX.to_le_bytes()).unwrap_err();
        assert!(refused.to_string().contains("more memory than its length allows"), "{refused}");
    }

    #[test]
    fn a_value_nested_past_the_bound_is_an_error_not_a_stack_overflow() {
        // Within the bound: 20 batches, each inside the one before (no build makes one; apply refuses it).
        assert!(decode::<Entry<TypeConfig>>(&nested_batch(20)).is_ok());
        for levels in [40, 1_000, 100_000] {
            let refused = decode::<Entry<TypeConfig>>(&nested_batch(levels)).unwrap_err();
            assert!(refused.to_string().contains("nested more than"), "{levels} levels: {refused}");
        }
    }
}
