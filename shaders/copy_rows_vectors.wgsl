// `copy_rows.wgsl` for rows that are not whole 16-byte vectors (GPT-2's 50257 logits): the
// source as 4-byte words, the output as 16-byte vectors, an invocation writing one vector of
// the output: {{PER}} elements, 2-byte ones (f16) each taken out of its source word by a shift,
// so that no adapter needs f16 in shaders and no store is narrower than a word, or 4-byte
// ones. Counts, strides and offsets are in elements; the output starts on 16 bytes (a fresh
// tensor), and a total that is not a multiple of {{PER}} is completed with zeros, inside its
// block (blocks are whole multiples of 512 bytes).
{{PARAMS}}
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<u32>>;

{{ELEMENT}}

// An invocation writes 16 bytes of the output ({{PER}} elements) and divides once: one word an
// invocation, dividing for each element, ran at about 1.8 TB/s on the H200 (0.91 ms for
// GPT-2's [8192, 50257] f16 logits).
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = gid.x + gid.y * nw.x * 256u;
    let e0 = {{PER}}u * w;
    if e0 >= p.total {
        return;
    }
    var r = e0 / p.out_cols;
    var c = e0 - r * p.out_cols;
    var h: array<u32, {{PER}}>;
    for (var k = 0u; k < {{PER}}u; k++) {
        var v = 0u;
        if e0 + k < p.total && c < p.x_cols {
            v = element(p.x_off + r * p.x_stride + c);
        }
        h[k] = v;
        c += 1u;
        if c == p.out_cols {
            c = 0u;
            r += 1u;
        }
    }
    out[p.out_off / {{PER}}u + w] = {{PACK}};
}
