// The immediates and bindings of the 64-tile matmul (`matmul.wgsl`) and of the one without
// workgroup memory (`matmul_reg.wgsl`): out[b] = a[b] @ b[b] over any strides, in elements.
{{ENABLES}}
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
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
