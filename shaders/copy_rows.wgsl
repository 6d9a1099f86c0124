// Rows copied between row strides, in 4-byte words (`{{U}}`: u32, or vec4<u32> where every
// count and offset is a multiple of 16 bytes; into fresh outputs, other rows go through
// `copy_rows_vectors.wgsl`), any dtype:
// out[r, c] = x[r, c] for c < the source's columns, else zero, into a contiguous output. It
// pads a ragged operand with zeros to whole tensor-core tiles, and keeps the first columns of
// a padded product, each in one pass at the word width, where the strided elementwise copy
// moves one element per invocation (and the pad was a fill and a copy).
{{PARAMS}}
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{U}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{U}}>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.total {
        return;
    }
    let r = i / p.out_cols;
    let c = i - r * p.out_cols;
    var v = {{U}}();
    if c < p.x_cols {
        v = x[p.x_off + r * p.x_stride + c];
    }
    out[p.out_off + i] = v;
}
