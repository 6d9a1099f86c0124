// Shared by the vec4 modes (`Io::ConvVec4`): the swizzled shared tile, and a vector of four k
// values of one row (A) or column (B) scattered into four tile rows (vector v of the slice:
// row or column v / 4, k quad v % 4). A mode whose vectors lie along the tile's row stores
// them whole instead.
fn tile_at(buf: u32, k: u32, c: u32) -> u32 {
    return buf + k * {{ROW}}u + ((c / 4u) ^ ((k % 8u) * {{SWZ}}u));
}

// The same in A's tile, whose rows are shorter in the 64x256 tile.
fn tile_at_a(buf: u32, k: u32, c: u32) -> u32 {
    return buf + k * {{ROW_A}}u + ((c / 4u) ^ ((k % 8u) * {{SWZ}}u));
}

fn scatter_a4(buf: u32, v: u32, x: vec4<f32>) {
    let m = v / 4u;
    let k = 4u * (v % 4u);
    for (var j = 0u; j < 4u; j++) {
        tile_a[tile_at_a(buf, k + j, m)][m % 4u] = x[j];
    }
}

fn scatter_b4(buf: u32, v: u32, x: vec4<f32>) {
    let n = v / 4u;
    let k = 4u * (v % 4u);
    for (var j = 0u; j < 4u; j++) {
        tile_b[tile_at(buf, k + j, n)][n % 4u] = x[j];
    }
}
