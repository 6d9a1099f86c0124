//! The row copies' forms (`shaders/copy_rows.wgsl`, `copy_rows_vectors.wgsl`): rows copied
//! between row strides with zero padding, as `ops::copy_rows` chooses them by the rows' bytes.

/// How `Kernel::CopyRows` moves rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowCopy {
    /// 16-byte vectors, one an invocation: every count and offset a multiple of 16 bytes.
    Vectors,
    /// 4-byte words, one an invocation.
    Words,
    /// 4-byte elements, four an invocation into one 16-byte vector of a fresh output.
    WordsToVectors,
    /// 2-byte elements, eight an invocation into one 16-byte vector of a fresh output.
    HalvesToVectors,
}

/// The row copies' immediates (`shaders/copy_rows_params.wgsl`).
const PARAMS: &str = include_str!("../../shaders/copy_rows_params.wgsl");

impl RowCopy {
    /// Every form, for validation.
    pub const ALL: [RowCopy; 4] = [
        RowCopy::Vectors,
        RowCopy::Words,
        RowCopy::WordsToVectors,
        RowCopy::HalvesToVectors,
    ];

    /// The kernel's name, as the profiler prints it.
    pub fn name(self) -> &'static str {
        match self {
            RowCopy::HalvesToVectors => "copy_rows_f16",
            RowCopy::WordsToVectors => "copy_rows_words",
            RowCopy::Vectors => "copy_rows_vec4",
            RowCopy::Words => "copy_rows",
        }
    }

    /// The form's WGSL.
    pub fn source(self) -> String {
        let vectors =
            || include_str!("../../shaders/copy_rows_vectors.wgsl").replace("{{PARAMS}}", PARAMS);
        match self {
            RowCopy::HalvesToVectors => vectors()
                .replace(
                    "{{ELEMENT}}",
                    "// The 16 bits of source element `s`.\nfn element(s: u32) -> u32 {\n    \
                     return (x[s / 2u] >> ((s % 2u) * 16u)) & 0xffffu;\n}",
                )
                .replace(
                    "{{PACK}}",
                    "vec4<u32>(h[0] | (h[1] << 16u), h[2] | (h[3] << 16u),\n        \
                     h[4] | (h[5] << 16u), h[6] | (h[7] << 16u))",
                )
                .replace("{{PER}}", "8"),
            RowCopy::WordsToVectors => vectors()
                .replace(
                    "{{ELEMENT}}",
                    "// Source element `s`.\nfn element(s: u32) -> u32 {\n    return x[s];\n}",
                )
                .replace("{{PACK}}", "vec4<u32>(h[0], h[1], h[2], h[3])")
                .replace("{{PER}}", "4"),
            RowCopy::Vectors | RowCopy::Words => {
                let unit = match self {
                    RowCopy::Vectors => "vec4<u32>",
                    _ => "u32",
                };
                include_str!("../../shaders/copy_rows.wgsl")
                    .replace("{{PARAMS}}", PARAMS)
                    .replace("{{U}}", unit)
            }
        }
    }
}
