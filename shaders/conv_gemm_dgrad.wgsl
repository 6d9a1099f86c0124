// dgrad: A = wd [group][tap][co][ci] (read along ci, the GEMM's m), B = dy gathered through
// the inverse window (a pixel of x gets dy[oy, ox] where oy * sh = y + ph - ki * dh exactly),
// out = dx, each element written once.
fn a_coord(e: u32) -> vec2<u32> {
    return vec2<u32>(e % BM, e / BM);
}

fn b_coord(e: u32) -> vec2<u32> {
    return vec2<u32>(e / 128u, e % 128u);
}

struct PreA {
    g: u32,
    m: u32,
    kr: u32,
}

fn pre_a(bt: u32, m0: u32, li: u32) -> PreA {
    return PreA(bt, m0 + li % BM, li / BM);
}

fn slice_a(pa: PreA, k0: u32) -> u32 {
    return k0 + pa.kr;
}

fn load_a(pa: PreA, k: u32, k0: u32, r: u32) -> f32 {
    let kk = k + r * (256u / BM);
    if pa.m < p.m && kk < p.k {
        return f32(a[p.off_a + (pa.g * p.k + kk) * p.cg + pa.m]);
    }
    return 0.0;
}

struct PreB {
    ok: bool,
    // dy's offset of (img, first channel of the group).
    base: u32,
    ty0: i32,
    tx0: i32,
    kr: u32,
}

fn pre_b(bt: u32, n0: u32, li: u32) -> PreB {
    let n = n0 + li % 128u;
    let hw = p.h * p.w;
    let img = n / hw;
    let q = n % hw;
    return PreB(
        n < p.n,
        p.off_b + (img * p.o + bt * p.og) * p.oh * p.ow,
        i32(q / p.w + p.ph),
        i32(q % p.w + p.pw),
        li / 128u,
    );
}

// The element of dy that (k, this invocation's pixel of x) reads, or -1 where none does.
fn b_at(pb: PreB, k: u32) -> i32 {
    let tap = k / p.og;
    let co = k % p.og;
    let ty = pb.ty0 - i32((tap / p.kw) * p.dh);
    let tx = pb.tx0 - i32((tap % p.kw) * p.dw);
    if !pb.ok || k >= p.k || ty < 0 || tx < 0 {
        return -1;
    }
    let oy = u32(ty) / p.sh;
    let ox = u32(tx) / p.sw;
    if oy * p.sh != u32(ty) || ox * p.sw != u32(tx) || oy >= p.oh || ox >= p.ow {
        return -1;
    }
    return i32(pb.base + co * p.oh * p.ow + oy * p.ow + ox);
}

// dy's channels lie p.oh * p.ow apart.
fn b_channel() -> u32 {
    return p.oh * p.ow;
}

// Input channels m, pixels n..n+3 of group bt.
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if m >= p.m {
        return;
    }
    let hw = p.h * p.w;
    for (var j = 0u; j < 4u; j++) {
        let nn = n + j;
        if nn < p.n {
            out[p.off_out + ((nn / hw) * p.c + bt * p.cg + m) * hw + nn % hw] = {{O}}(v[j]);
        }
    }
}
