//! A serde serializer to Python's pickle, protocol 4, with only the opcodes PyTorch's browser
//! viewer (`MemoryViz.js`) reads: PROTO, EMPTY_DICT/EMPTY_LIST/EMPTY_TUPLE, MARK, SETITEMS,
//! APPENDS, TUPLE/TUPLE1-3, SHORT_BINUNICODE/BINUNICODE, BININT1/BININT2/BININT/LONG1, BINFLOAT,
//! NEWTRUE/NEWFALSE, NONE and STOP. No memo and no frames (both optional in protocol 4), so the
//! files also load with Python's own `pickle`. Structs become dicts in field order, as the
//! snapshot's dicts are in PyTorch; tuples become tuples (`segment_pool_id`).

use serde::ser::{self, Serialize};

const PROTO: u8 = 0x80;
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const NONE: u8 = b'N';
const STOP: u8 = b'.';

/// Python's pickler batches APPENDS/SETITEMS by this many items.
const BATCH: usize = 1000;

/// A value PyTorch's snapshot format cannot hold.
#[derive(Debug)]
pub struct PickleError(String);

impl std::fmt::Display for PickleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for PickleError {}
impl ser::Error for PickleError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        PickleError(msg.to_string())
    }
}

/// `pickle.dumps(value, protocol=4)` for a serde value.
pub fn to_pickle<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, PickleError> {
    let mut out = Pickler(vec![PROTO, 4]);
    value.serialize(&mut out)?;
    out.0.push(STOP);
    Ok(out.0)
}

/// Writes Python pickle protocol 2, as `torch.cuda.memory._dump_snapshot` does.
pub struct Pickler(Vec<u8>);

impl Pickler {
    fn int(&mut self, v: i128) {
        if (0..=0xff).contains(&v) {
            self.0.extend([BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.0.push(BININT2);
            self.0.extend((v as u16).to_le_bytes());
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            self.0.push(BININT);
            self.0.extend((v as i32).to_le_bytes());
        } else {
            // LONG1: the shortest two's-complement little-endian form.
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let (top, next) = (bytes[n - 1], bytes[n - 2]);
                if (top == 0 && next < 0x80) || (top == 0xff && next >= 0x80) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.0.extend([LONG1, n as u8]);
            self.0.extend(&bytes[..n]);
        }
    }

    fn str(&mut self, s: &str) {
        if s.len() < 256 {
            self.0.extend([SHORT_BINUNICODE, s.len() as u8]);
        } else {
            self.0.push(BINUNICODE);
            self.0.extend((s.len() as u32).to_le_bytes());
        }
        self.0.extend(s.as_bytes());
    }
}

/// A list or dict being written: items since the last MARK, flushed in batches.
pub struct Container<'a> {
    p: &'a mut Pickler,
    flush: u8,
    /// Items (list) or pairs (dict) since the last mark; `None` once closed.
    pending: usize,
    marked: bool,
    /// For tuples: the element count (no batching).
    tuple: Option<usize>,
}

impl<'a> Container<'a> {
    fn list(p: &'a mut Pickler) -> Self {
        p.0.push(EMPTY_LIST);
        Container {
            p,
            flush: APPENDS,
            pending: 0,
            marked: false,
            tuple: None,
        }
    }
    fn dict(p: &'a mut Pickler) -> Self {
        p.0.push(EMPTY_DICT);
        Container {
            p,
            flush: SETITEMS,
            pending: 0,
            marked: false,
            tuple: None,
        }
    }
    fn tuple(p: &'a mut Pickler, len: usize) -> Self {
        if len > 3 {
            p.0.push(MARK);
        }
        Container {
            p,
            flush: TUPLE,
            pending: 0,
            marked: true,
            tuple: Some(len),
        }
    }
    fn before_item(&mut self) {
        if self.tuple.is_some() {
            return;
        }
        if !self.marked {
            self.p.0.push(MARK);
            self.marked = true;
        }
    }
    fn after_item(&mut self) {
        if self.tuple.is_some() {
            return;
        }
        self.pending += 1;
        if self.pending == BATCH {
            self.p.0.push(self.flush);
            self.pending = 0;
            self.marked = false;
        }
    }
    fn close(self) {
        match self.tuple {
            Some(0) => self.p.0.push(EMPTY_TUPLE),
            Some(1) => self.p.0.push(TUPLE1),
            Some(2) => self.p.0.push(TUPLE2),
            Some(3) => self.p.0.push(TUPLE3),
            Some(_) => self.p.0.push(TUPLE),
            None if self.marked => self.p.0.push(self.flush),
            None => {}
        }
    }
}

type R = Result<(), PickleError>;

impl<'a> ser::Serializer for &'a mut Pickler {
    type Ok = ();
    type Error = PickleError;
    type SerializeSeq = Container<'a>;
    type SerializeTuple = Container<'a>;
    type SerializeTupleStruct = Container<'a>;
    type SerializeTupleVariant = ser::Impossible<(), PickleError>;
    type SerializeMap = Container<'a>;
    type SerializeStruct = Container<'a>;
    type SerializeStructVariant = ser::Impossible<(), PickleError>;

    fn serialize_bool(self, v: bool) -> R {
        self.0.push(if v { NEWTRUE } else { NEWFALSE });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> R {
        self.serialize_i64(v as i64)
    }
    fn serialize_i16(self, v: i16) -> R {
        self.serialize_i64(v as i64)
    }
    fn serialize_i32(self, v: i32) -> R {
        self.serialize_i64(v as i64)
    }
    fn serialize_i64(self, v: i64) -> R {
        self.int(v as i128);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> R {
        self.serialize_u64(v as u64)
    }
    fn serialize_u16(self, v: u16) -> R {
        self.serialize_u64(v as u64)
    }
    fn serialize_u32(self, v: u32) -> R {
        self.serialize_u64(v as u64)
    }
    fn serialize_u64(self, v: u64) -> R {
        self.int(v as i128);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> R {
        self.serialize_f64(v as f64)
    }
    fn serialize_f64(self, v: f64) -> R {
        self.0.push(BINFLOAT);
        self.0.extend(v.to_be_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> R {
        self.str(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> R {
        self.str(v);
        Ok(())
    }
    fn serialize_bytes(self, _v: &[u8]) -> R {
        Err(ser::Error::custom("bytes are not used in snapshots"))
    }
    fn serialize_none(self) -> R {
        self.0.push(NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> R {
        v.serialize(self)
    }
    fn serialize_unit(self) -> R {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R {
        self.serialize_none()
    }
    fn serialize_unit_variant(self, _n: &'static str, _i: u32, variant: &'static str) -> R {
        self.str(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _n: &'static str, v: &T) -> R {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _n: &'static str,
        _i: u32,
        _variant: &'static str,
        _v: &T,
    ) -> R {
        Err(ser::Error::custom(
            "newtype variants are not used in snapshots",
        ))
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Container<'a>, PickleError> {
        Ok(Container::list(self))
    }
    fn serialize_tuple(self, len: usize) -> Result<Container<'a>, PickleError> {
        Ok(Container::tuple(self, len))
    }
    fn serialize_tuple_struct(
        self,
        _n: &'static str,
        len: usize,
    ) -> Result<Container<'a>, PickleError> {
        Ok(Container::tuple(self, len))
    }
    fn serialize_tuple_variant(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, PickleError> {
        Err(ser::Error::custom(
            "tuple variants are not used in snapshots",
        ))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Container<'a>, PickleError> {
        Ok(Container::dict(self))
    }
    fn serialize_struct(self, _n: &'static str, _len: usize) -> Result<Container<'a>, PickleError> {
        Ok(Container::dict(self))
    }
    fn serialize_struct_variant(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, PickleError> {
        Err(ser::Error::custom(
            "struct variants are not used in snapshots",
        ))
    }
}

impl ser::SerializeSeq for Container<'_> {
    type Ok = ();
    type Error = PickleError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        self.before_item();
        v.serialize(&mut *self.p)?;
        self.after_item();
        Ok(())
    }
    fn end(self) -> R {
        self.close();
        Ok(())
    }
}

impl ser::SerializeTuple for Container<'_> {
    type Ok = ();
    type Error = PickleError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        ser::SerializeSeq::serialize_element(self, v)
    }
    fn end(self) -> R {
        self.close();
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Container<'_> {
    type Ok = ();
    type Error = PickleError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        ser::SerializeSeq::serialize_element(self, v)
    }
    fn end(self) -> R {
        self.close();
        Ok(())
    }
}

impl ser::SerializeMap for Container<'_> {
    type Ok = ();
    type Error = PickleError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> R {
        self.before_item();
        k.serialize(&mut *self.p)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        v.serialize(&mut *self.p)?;
        self.after_item();
        Ok(())
    }
    fn end(self) -> R {
        self.close();
        Ok(())
    }
}

impl ser::SerializeStruct for Container<'_> {
    type Ok = ();
    type Error = PickleError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> R {
        self.before_item();
        self.p.str(key);
        v.serialize(&mut *self.p)?;
        self.after_item();
        Ok(())
    }
    fn skip_field(&mut self, _key: &'static str) -> R {
        Ok(())
    }
    fn end(self) -> R {
        self.close();
        Ok(())
    }
}
