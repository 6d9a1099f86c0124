
// The immediates of the transposed copies (`transpose.wgsl`, `transpose_pairs.wgsl`,
// `transpose_words.wgsl`; `TransposeJob::imm` in `ops/mod.rs`): out[b, r, c] = x[off + b * sb
// + c * lda + r] for rows x cols, in elements.
struct Params {
    rows: u32,
    cols: u32,
    off: u32,
    lda: u32,
    sb: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;
