// The immediates of `copy_rows.wgsl` and `copy_rows_vectors.wgsl` (`ops/copies.rs`, `copy_rows`).
// Counts, strides and offsets are in the kernel's unit: 16-byte vectors or words
// (`copy_rows.wgsl`), elements (`copy_rows_vectors.wgsl`).
struct Params {
    // Output units in all, and per row.
    total: u32,
    out_cols: u32,
    // Source units per row that are copied (the rest of an output row is zero), the source's
    // row stride, and both offsets.
    x_cols: u32,
    x_stride: u32,
    x_off: u32,
    out_off: u32,
    pad0: u32,
    pad1: u32,
}
