// The tree that merges the (max, sum of exp, NaN/+inf flag) triples of a workgroup of 256
// taking one row (`softmax_tree.wgsl`, `softmax_words.wgsl`): every invocation gets the row's.
var<workgroup> red_m: array<f32, 256>;
var<workgroup> red_s: array<f32, 256>;
var<workgroup> red_bad: array<u32, 256>;

struct RowStats {
    m: f32,
    s: f32,
    bad: u32,
}

fn merge_row(t: u32, m: f32, s: f32, bad: u32) -> RowStats {
    red_m[t] = m;
    red_s[t] = s;
    red_bad[t] = bad;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            let m1 = red_m[t];
            let m2 = red_m[t + k];
            let nm = max(m1, m2);
            red_s[t] = rescale(red_s[t], m1, nm) + rescale(red_s[t + k], m2, nm);
            red_m[t] = nm;
            red_bad[t] |= red_bad[t + k];
        }
        workgroupBarrier();
    }
    return RowStats(red_m[0], red_s[0], red_bad[0]);
}
