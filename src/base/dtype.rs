//! Element types. Sizes are PyTorch's, so a tensor's storage shows up in the memory statistics
//! with the bytes PyTorch would allocate.

use super::{Error, Result};

/// An element type, with PyTorch's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// The CPU device only (WGSL has no f64): finite-difference gradient checks run in it.
    F64,
    /// Needs the adapter's `shader-f16` on a GPU.
    F16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// One byte per element, as in PyTorch.
    Bool,
}

impl DType {
    /// Bytes per element, as PyTorch counts them (a bool is one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 => 8,
            DType::F16 => 2,
            DType::Bool => 1,
        }
    }

    /// Whether the type is a float (f32, f64 or f16).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16)
    }

    /// The short name (`f32`, `f16`, `i32`, ...), as errors and kernel names print it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is a tensor element.
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug {
    /// The dtype of this element type.
    const DTYPE: DType;
    /// The value as f64 (the CPU reference's arithmetic).
    fn to_f64(self) -> f64;
    /// The element nearest `v` (rounded, or saturated for integers as `as` does).
    fn from_f64(v: f64) -> Self;
    /// Appends the element's little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads an element from its little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                #[allow(clippy::redundant_closure_call)]
                ($to)(self)
            }
            fn from_f64(v: f64) -> Self {
                #[allow(clippy::redundant_closure_call)]
                ($from)(v)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element width"))
            }
        }
    };
}

element!(f32, DType::F32, |x: f32| x as f64, |v: f64| v as f32);
element!(
    half::f16,
    DType::F16,
    |x: half::f16| x.to_f64(),
    half::f16::from_f64
);
element!(f64, DType::F64, |x: f64| x, |v: f64| v);
element!(i32, DType::I32, |x: i32| x as f64, |v: f64| v as i32);
element!(u32, DType::U32, |x: u32| x as f64, |v: f64| v as u32);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// Checks that `got` is `want`, naming the op.
pub(crate) fn expect_dtype(op: &'static str, want: DType, got: DType) -> Result<()> {
    if want != got {
        return Err(Error::DTypeMismatch {
            op,
            expected: want,
            got,
        });
    }
    Ok(())
}
