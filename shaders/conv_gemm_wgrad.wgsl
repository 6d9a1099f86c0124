// wgrad: A = dy (read along the pixel, the GEMM's k), B = x gathered (also along the pixel),
// out = this split's f32 partial of dw [split][group][co][tap][ci]; the splits are summed after.
fn a_coord(e: u32) -> vec2<u32> {
    return vec2<u32>(e / 16u, e % 16u);
}

fn b_coord(e: u32) -> vec2<u32> {
    return vec2<u32>(e % 16u, e / 16u);
}

struct PreA {
    g: u32,
    kbase: u32,
    m: u32,
    kk: u32,
}

fn pre_a(bt: u32, m0: u32, li: u32) -> PreA {
    return PreA(bt % p.groups, (bt / p.groups) * p.k, m0 + li / 16u, li % 16u);
}

// dy's offset of (img, group's first channel, pixel) for this invocation's k, or -1.
fn slice_a(pa: PreA, k0: u32) -> i32 {
    let kl = k0 + pa.kk;
    let kg = pa.kbase + kl;
    if kl >= p.k || kg >= p.k_total {
        return -1;
    }
    let ohw = p.oh * p.ow;
    return i32(p.off_a + ((kg / ohw) * p.o + pa.g * p.og) * ohw + kg % ohw);
}

fn load_a(pa: PreA, s: i32, k0: u32, r: u32) -> f32 {
    let m = pa.m + 16u * r;
    if s < 0 || m >= p.m {
        return 0.0;
    }
    return f32(a[u32(s) + m * p.oh * p.ow]);
}

struct PreB {
    g: u32,
    kbase: u32,
    n: u32,
    kk: u32,
}

fn pre_b(bt: u32, n0: u32, li: u32) -> PreB {
    return PreB(bt % p.groups, (bt / p.groups) * p.k, n0 + li / 16u, li % 16u);
}

struct SliceB {
    ok: bool,
    base: u32,
    ih0: i32,
    iw0: i32,
}

fn slice_b(pb: PreB, k0: u32) -> SliceB {
    let kl = k0 + pb.kk;
    let kg = pb.kbase + kl;
    let ohw = p.oh * p.ow;
    let img = kg / ohw;
    let q = kg % ohw;
    return SliceB(
        kl < p.k && kg < p.k_total,
        p.off_b + (img * p.c + pb.g * p.cg) * p.h * p.w,
        i32((q / p.ow) * p.sh) - i32(p.ph),
        i32((q % p.ow) * p.sw) - i32(p.pw),
    );
}

fn load_b(pb: PreB, s: SliceB, k0: u32, r: u32) -> f32 {
    let n = pb.n + 16u * r;
    if !s.ok || n >= p.n {
        return 0.0;
    }
    let tap = n / p.cg;
    let ci = n % p.cg;
    let ih = s.ih0 + i32((tap / p.kw) * p.dh);
    let iw = s.iw0 + i32((tap % p.kw) * p.dw);
    if !inside(ih, iw) {
        return 0.0;
    }
    return f32(b[s.base + ci * p.h * p.w + u32(ih) * p.w + u32(iw)]);
}
