// The counter-based generator's hash, shared by `random.wgsl` and the attention kernels'
// dropout: a pure function of (seed, counter), computed with 32-bit integers only, so that every
// adapter and the CPU reference (src/cpu/random.rs) draw the same bits. Reads `p.seed_lo` and
// `p.seed_hi` from the including kernel's immediates.

// "lowbias32" (Wellons): a 32-bit integer hash with strong avalanche.
fn lowbias32(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

fn bits(counter: u32) -> u32 {
    return lowbias32(lowbias32(counter + p.seed_lo * 0x9e3779b9u) ^ p.seed_hi);
}

// Uniform in [0, 1) with 24 random bits: exact in f32.
fn uniform(counter: u32) -> f32 {
    return f32(bits(counter) >> 8u) * 5.9604644775390625e-8;
}
