//! Specialises `shaders/softmax.wgsl` and `shaders/softmax_backward.wgsl` per (dtype, rows'
//! layout, an invocation or a workgroup per row).

use crate::base::DType;

/// How a softmax kernel reads and writes its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowLayout {
    /// Contiguous rows of whole vec4s at vec4-aligned offsets, a vec4 at a time.
    Vec4,
    /// Any rows, an element at a time (the forward through the coalesced dims and strides).
    Strided,
    /// Contiguous rows of 2- or 4-byte elements at offsets of whole 16-byte chunks, the chunks
    /// inside a row as `vec4<u32>` and the elements it shares a chunk with its neighbours one
    /// at a time (`shaders/softmax_words.wgsl`, `softmax_backward_words.wgsl`); a workgroup
    /// per row only.
    Words,
}

impl RowLayout {
    /// The layout a kernel takes: vec4 rows as vec4s; else words rows (`words`: they fit) in a
    /// workgroup per row, the words kernels having no serial form; else strided.
    pub fn of(vec4: bool, words: bool, serial: bool) -> RowLayout {
        match (vec4, words && !serial) {
            (true, _) => RowLayout::Vec4,
            (false, true) => RowLayout::Words,
            (false, false) => RowLayout::Strided,
        }
    }

    fn name(self) -> &'static str {
        match self {
            RowLayout::Vec4 => "vec4",
            RowLayout::Strided => "strided",
            RowLayout::Words => "words",
        }
    }
}

/// One softmax kernel (forward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxKernel {
    /// The tensors' dtype.
    pub dtype: DType,
    /// How the rows are read and written.
    pub layout: RowLayout,
    /// One invocation per row (`softmax_serial.wgsl`) instead of a workgroup per row.
    pub serial: bool,
}

/// Chunks an invocation of the words kernels keeps in flight: 64 bytes (f16) or 128 (f32).
const WORDS_UNROLL: [(DType, u32); 2] = [(DType::F16, 4), (DType::F32, 8)];

impl SoftmaxKernel {
    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        format!(
            "softmax_{}_{}_{}",
            self.dtype,
            self.layout.name(),
            if self.serial { "serial" } else { "tree" }
        )
    }

    /// The kernel's WGSL.
    pub fn source(&self) -> String {
        let t = if self.dtype == DType::F16 {
            "f16"
        } else {
            "f32"
        };
        let (tx, load, store) = match self.layout {
            RowLayout::Vec4 => (
                format!("vec4<{t}>"),
                "return vec4<f32>(x[p.off + e]);".to_string(),
                format!("out[e] = vec4<{t}>(v);"),
            ),
            RowLayout::Strided => (
                t.to_string(),
                "return vec4<f32>(f32(x[offset(e)]), neg_inf(), neg_inf(), neg_inf());".to_string(),
                format!("out[e] = {t}(v.x);"),
            ),
            RowLayout::Words => (
                t.to_string(),
                "return vec4<f32>(f32(x[p.off + e]), neg_inf(), neg_inf(), neg_inf());".to_string(),
                format!("out[e] = {t}(v.x);"),
            ),
        };
        let main = match (self.serial, self.layout) {
            (true, _) => include_str!("../../shaders/softmax_serial.wgsl").to_string(),
            (false, RowLayout::Words) => {
                self.words(include_str!("../../shaders/softmax_words.wgsl"))
            }
            (false, _) => include_str!("../../shaders/softmax_tree.wgsl").to_string(),
        };
        include_str!("../../shaders/softmax.wgsl")
            .replace("{{MAIN}}", &main)
            .replace(
                "{{MERGE}}",
                include_str!("../../shaders/softmax_merge.wgsl"),
            )
            .replace(
                "{{ENABLES}}",
                if self.dtype == DType::F16 {
                    "enable f16;"
                } else {
                    ""
                },
            )
            .replace("{{TX}}", &tx)
            .replace("{{LOAD}}", &load)
            .replace("{{STORE}}", &store)
    }

    /// A words kernel's template with its chunk, its unroll and its chunk conversions
    /// (`words_chunks`).
    fn words(&self, src: &str) -> String {
        let unroll = WORDS_UNROLL
            .iter()
            .find(|(d, _)| *d == self.dtype)
            .map_or(4, |&(_, u)| u);
        words_chunks(src, self.dtype).replace("{{UNROLL}}", &unroll.to_string())
    }

    /// The backward's kernel name (`shaders/softmax_backward.wgsl`).
    pub fn backward_name(&self) -> String {
        format!(
            "softmax_backward{}_{}{}",
            if self.serial { "" } else { "_tree" },
            self.dtype,
            match self.layout {
                RowLayout::Strided => String::new(),
                l => format!("_{}", l.name()),
            }
        )
    }

    /// `shaders/softmax_backward.wgsl` for these rows: vec4 units, or one element in lane x of
    /// a vec4 whose other lanes are 0 (its entry point, `main` or `rows_tree`, picks serial);
    /// with `softmax_backward_words.wgsl` (entry point `rows_words`) for words rows.
    pub fn backward_source(&self) -> String {
        let (tx, load, store) = match self.layout {
            RowLayout::Vec4 => (
                "vec4<{{T}}>",
                "return vec4<f32>(SRC[at]);",
                "out[at] = vec4<{{T}}>(v);",
            ),
            RowLayout::Strided | RowLayout::Words => (
                "{{T}}",
                "return vec4<f32>(f32(SRC[at]), 0.0, 0.0, 0.0);",
                "out[at] = {{T}}(v.x);",
            ),
        };
        let mut src = include_str!("../../shaders/softmax_backward.wgsl").to_string();
        if self.layout == RowLayout::Words {
            src += &self.words(include_str!("../../shaders/softmax_backward_words.wgsl"));
        }
        super::per_dtype(
            &src.replace("{{TX}}", tx)
                .replace("{{LOAD_Y}}", &load.replace("SRC", "y"))
                .replace("{{LOAD_G}}", &load.replace("SRC", "g"))
                .replace("{{STORE}}", store),
            self.dtype,
        )
        .into_owned()
    }

    /// Buffers the forward binds (the words kernels bind each buffer twice).
    pub(crate) fn bindings(&self) -> u32 {
        match self.layout {
            RowLayout::Words => 4,
            _ => 2,
        }
    }

    /// Every variant, for validation.
    pub fn all() -> Vec<SoftmaxKernel> {
        let mut v = Vec::new();
        for dtype in [DType::F32, DType::F16] {
            for layout in [RowLayout::Vec4, RowLayout::Strided, RowLayout::Words] {
                for serial in [false, true] {
                    // The words kernels have no serial form.
                    if !(serial && layout == RowLayout::Words) {
                        v.push(SoftmaxKernel {
                            dtype,
                            layout,
                            serial,
                        });
                    }
                }
            }
        }
        v
    }
}

/// A template that reads and writes 16-byte chunks of `dtype` (2- or 4-byte floats) as
/// `vec4<u32>`: `{{CHUNK}}` (the elements of a chunk) and the conversions of a chunk (`{{GET}}`
/// from the `vec4<u32>` `w` to `CV` vec4<f32>s, `{{PUT}}` from those, `v`, back).
pub(crate) fn words_chunks(src: &str, dtype: DType) -> String {
    let (chunk, get, put) = match dtype {
        DType::F16 => (
            8,
            "return array<vec4<f32>, CV>(vec4<f32>(unpack2x16float(w.x), \
             unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));",
            "return vec4<u32>(pack2x16float(v[0].xy), pack2x16float(v[0].zw), \
             pack2x16float(v[1].xy), pack2x16float(v[1].zw));",
        ),
        _ => (
            4,
            "return array<vec4<f32>, CV>(bitcast<vec4<f32>>(w));",
            "return bitcast<vec4<u32>>(v[0]);",
        ),
    };
    src.replace("{{CHUNK}}", &chunk.to_string())
        .replace("{{GET}}", get)
        .replace("{{PUT}}", put)
}
