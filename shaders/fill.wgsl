// Fills a range of 32-bit words with one value. The kernel behind `zero_`/`fill_`.
// Parameters travel as immediates, so they stay ordered with the dispatch.

struct Params {
    len_words: u32,
    value: u32,
}

var<immediate> params: Params;

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i < params.len_words {
        dst[i] = params.value;
    }
}
