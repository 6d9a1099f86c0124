// fwd: A = wp [o][tap][ci] (rows of K = taps * cg), B = x gathered, out = y (+ bias).
// A is read along k (16 consecutive invocations per row), B along the output pixel.
fn a_coord(e: u32) -> vec2<u32> {
    return vec2<u32>(e / 16u, e % 16u);
}

fn b_coord(e: u32) -> vec2<u32> {
    return vec2<u32>(e / 128u, e % 128u);
}

struct PreA {
    g: u32,
    m: u32,
    kk: u32,
}

fn pre_a(bt: u32, m0: u32, li: u32) -> PreA {
    return PreA(bt, m0 + li / 16u, li % 16u);
}

fn slice_a(pa: PreA, k0: u32) -> u32 {
    return k0 + pa.kk;
}

fn load_a(pa: PreA, k: u32, k0: u32, r: u32) -> f32 {
    let m = pa.m + 16u * r;
    if m < p.m && k < p.k {
        return f32(a[p.off_a + (pa.g * p.og + m) * p.k + k]);
    }
    return 0.0;
}

struct PreB {
    ok: bool,
    // x's offset of (img, first channel of the group).
    base: u32,
    ih0: i32,
    iw0: i32,
    kr: u32,
}

fn pre_b(bt: u32, n0: u32, li: u32) -> PreB {
    let n = n0 + li % 128u;
    let ohw = p.oh * p.ow;
    let img = n / ohw;
    let q = n % ohw;
    let y = q / p.ow;
    let x = q % p.ow;
    return PreB(
        n < p.n,
        p.off_b + (img * p.c + bt * p.cg) * p.h * p.w,
        i32(y * p.sh) - i32(p.ph),
        i32(x * p.sw) - i32(p.pw),
        li / 128u,
    );
}

// The element of x that (k, this invocation's pixel) reads, or -1 outside (zero padding).
fn b_at(pb: PreB, k: u32) -> i32 {
    let tap = k / p.cg;
    let ci = k % p.cg;
    let ih = pb.ih0 + i32((tap / p.kw) * p.dh);
    let iw = pb.iw0 + i32((tap % p.kw) * p.dw);
    if !pb.ok || k >= p.k || !inside(ih, iw) {
        return -1;
    }
    return i32(pb.base + ci * p.h * p.w + u32(ih) * p.w + u32(iw));
}

// x's channels lie p.h * p.w apart.
fn b_channel() -> u32 {
    return p.h * p.w;
}

// Output channels m, pixels n..n+3 of group bt.
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if m >= p.m {
        return;
    }
    let co = bt * p.og + m;
    var add = 0.0;
    if (p.flags & 1u) != 0u {
        add = f32(bias[p.off_bias + co]);
    }
    let ohw = p.oh * p.ow;
    for (var j = 0u; j < 4u; j++) {
        let nn = n + j;
        if nn < p.n {
            out[p.off_out + ((nn / ohw) * p.o + co) * ohw + nn % ohw] = {{O}}(v[j] + add);
        }
    }
}
