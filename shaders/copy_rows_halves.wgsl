// `copy_rows.wgsl` for 2-byte elements (f16) whose rows are not whole 4-byte words (GPT-2's
// 50257 logits): both buffers as 4-byte words, an invocation writing one word of the output
// (two elements, each taken out of its source word by a shift), so that no adapter needs f16
// in shaders and no store is narrower than a word. Counts, strides and offsets are in
// elements; the output starts on a word (a fresh tensor), and an odd total's last word is
// completed with a zero half, inside its block (blocks are whole multiples of 512 bytes).
struct Params {
    // Output elements in all, and per row.
    total: u32,
    out_cols: u32,
    // Source elements per row that are copied (the rest of an output row is zero), the
    // source's row stride, and both offsets.
    x_cols: u32,
    x_stride: u32,
    x_off: u32,
    out_off: u32,
    pad0: u32,
    pad1: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

// The 16 bits of output element e: its source element's, or zero past the copied columns
// and the output.
fn half_at(e: u32) -> u32 {
    let r = e / p.out_cols;
    let c = e - r * p.out_cols;
    if e >= p.total || c >= p.x_cols {
        return 0u;
    }
    let s = p.x_off + r * p.x_stride + c;
    return (x[s / 2u] >> ((s % 2u) * 16u)) & 0xffffu;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = gid.x + gid.y * nw.x * 256u;
    if 2u * w >= p.total {
        return;
    }
    out[p.out_off / 2u + w] = half_at(2u * w) | (half_at(2u * w + 1u) << 16u);
}
