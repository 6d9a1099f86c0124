// The immediates of the plain matmul variants (`matmul128_io.wgsl`, `matmul128_vec4.wgsl`).
struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    off_a: u32,
    sab: u32,
    sam: u32,
    sak: u32,
    off_b: u32,
    sbb: u32,
    sbk: u32,
    sbn: u32,
    // The vec4 variant: bit 0 adds bias[off_bias + column] to every row (addmm's epilogue);
    // bit 1 (`Vec4Layout::ColRowSums`) writes the sums of A's rows to bias[off_bias + row].
    flags: u32,
    off_bias: u32,
    pad0: u32,
    pad1: u32,
}

var<immediate> p: Params;
