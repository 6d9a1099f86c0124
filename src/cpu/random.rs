//! The CPU side of the counter-based generator of `shaders/random.wgsl`: the same integer
//! hash, so uniform draws match the GPU bit for bit.

fn lowbias32(v: u32) -> u32 {
    let mut x = v;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

fn bits(seed: u64, counter: u32) -> u32 {
    let (lo, hi) = (seed as u32, (seed >> 32) as u32);
    lowbias32(lowbias32(counter.wrapping_add(lo.wrapping_mul(0x9e37_79b9))) ^ hi)
}

/// Uniform in [0, 1) with 24 random bits, exactly as the shader computes it.
pub(crate) fn uniform(seed: u64, counter: u32) -> f32 {
    (bits(seed, counter) >> 8) as f32 * 5.960_464_5e-8
}

/// Element `e` of a draw at `offset`: uniform in [a, b) or normal with mean a and std b.
pub(crate) fn sample(seed: u64, offset: u32, e: u32, normal: bool, a: f32, b: f32) -> f32 {
    if normal {
        let c = offset.wrapping_add(e.wrapping_mul(2));
        let u1 = 1.0 - uniform(seed, c);
        let u2 = uniform(seed, c.wrapping_add(1));
        a + b * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    } else {
        a + (b - a) * uniform(seed, offset.wrapping_add(e))
    }
}
