// Float helpers shared by the elementwise kernels (computed in f32, as PyTorch's opmath).

// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7): WGSL has no erf.
fn k_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
    return sign(x) * (1.0 - poly * exp(-a * a));
}

// gelu(approximate="tanh")'s exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3), the exponent capped
// below f32's overflow: 0.5 (1 + tanh u) = 1 / (1 + k_gelu_e(x)) (src/base/elementwise.rs).
fn k_gelu_e(x: f32) -> f32 {
    return exp(min(-1.5957691216057308 * (x + 0.044715 * x * x * x), 88.0));
}

// pow with PyTorch's meaning for negative bases and integer exponents.
fn k_pow(x: f32, y: f32) -> f32 {
    if y == 0.0 {
        return 1.0;
    }
    if x < 0.0 && floor(y) == y {
        let r = pow(-x, y);
        return select(r, -r, abs(y) % 2.0 == 1.0);
    }
    return pow(x, y);
}

// NaN from the bits: `x != x` may be folded away under WGSL's floating-point rules.
fn k_isnan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// maximum/minimum propagate NaN, as in PyTorch.
fn k_max(x: f32, y: f32) -> f32 {
    return select(select(max(x, y), x, k_isnan(x)), y, k_isnan(y));
}

fn k_min(x: f32, y: f32) -> f32 {
    return select(select(min(x, y), x, k_isnan(x)), y, k_isnan(y));
}
