// The gathered B of fwd and dgrad (`conv_gemm_window.wgsl`): `b_at(pb, k)` is the element
// that row k of this invocation's column reads (or -1), `b_channel()` the distance between
// two channels of B's tensor. Aligned, a slice's 16 rows share one tap: its first row is
// found once (`slice_b`) and the rest lie channels apart; else each row finds its own tap.
fn slice_b(pb: PreB, k0: u32) -> i32 {
    if aligned() {
        return b_at(pb, k0 + pb.kr);
    }
    return 0;
}

fn load_b(pb: PreB, s: i32, k0: u32, r: u32) -> f32 {
    var at = s;
    if aligned() {
        if at < 0 {
            return 0.0;
        }
        at += i32(2u * r * b_channel());
    } else {
        at = b_at(pb, k0 + pb.kr + 2u * r);
        if at < 0 {
            return 0.0;
        }
    }
    return f32(b[u32(at)]);
}
