//! Datasets for the examples and tests: a procedurally generated image set that needs no
//! download, a reader for MNIST's IDX files, and the `DataLoader` that feeds them to a device
//! through pinned memory.

mod loader;

pub use loader::{
    Batch, Batches, DataLoader, Dataset, DistributedSampler, LoaderOptions, LoaderState, Resumable,
};

use crate::{Error, Result};
use std::path::Path;

/// Images [n, 1, side, side] in [0, 1] (row-major, f32) with i32 labels.
pub struct ImageSet {
    /// The images, row-major, `side * side` floats each, in [0, 1].
    pub images: Vec<f32>,
    /// Each image's class.
    pub labels: Vec<i32>,
    /// The images' height and width.
    pub side: usize,
    /// The number of classes.
    pub classes: usize,
}

impl ImageSet {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Pixels of image `i`.
    pub fn image(&self, i: usize) -> &[f32] {
        let px = self.side * self.side;
        &self.images[i * px..(i + 1) * px]
    }
}

/// SplitMix64: a small seeded generator for the host-side data.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Ten classes of 28x28 "glyphs": each class is a fixed set of strokes (drawn from the class
/// seed), and each sample shifts it by up to 4 pixels, scales its intensity and adds noise, so
/// that a classifier has to learn shapes, not pixels. `seed` picks the samples; the glyphs are
/// the same for every seed (train and test sets share classes).
pub fn synthetic_glyphs(n: usize, seed: u64) -> ImageSet {
    const SIDE: usize = 28;
    const CLASSES: usize = 10;
    let glyphs: Vec<Vec<f32>> = (0..CLASSES)
        .map(|c| {
            let mut rng = SplitMix(0xC1A55 + c as u64 * 7919);
            let mut g = vec![0f32; SIDE * SIDE];
            for _ in 0..3 {
                // A stroke between two points in the central 20x20.
                let (x0, y0) = (4.0 + 20.0 * rng.uniform(), 4.0 + 20.0 * rng.uniform());
                let (x1, y1) = (4.0 + 20.0 * rng.uniform(), 4.0 + 20.0 * rng.uniform());
                for s in 0..=40 {
                    let t = s as f32 / 40.0;
                    let (x, y) = (x0 + t * (x1 - x0), y0 + t * (y1 - y0));
                    for dy in -1i32..=1 {
                        for dx in -1i32..=1 {
                            let (px, py) = (x as i32 + dx, y as i32 + dy);
                            if (0..SIDE as i32).contains(&px) && (0..SIDE as i32).contains(&py) {
                                let v = if dx == 0 && dy == 0 { 1.0 } else { 0.5 };
                                let at = py as usize * SIDE + px as usize;
                                g[at] = g[at].max(v);
                            }
                        }
                    }
                }
            }
            g
        })
        .collect();
    let mut rng = SplitMix(seed);
    let mut images = Vec::with_capacity(n * SIDE * SIDE);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        let c = (rng.next_u64() % CLASSES as u64) as usize;
        let (sx, sy) = (
            (rng.next_u64() % 9) as i32 - 4,
            (rng.next_u64() % 9) as i32 - 4,
        );
        let gain = 0.3 + 0.7 * rng.uniform();
        for y in 0..SIDE as i32 {
            for x in 0..SIDE as i32 {
                let (gx, gy) = (x - sx, y - sy);
                let v = if (0..SIDE as i32).contains(&gx) && (0..SIDE as i32).contains(&gy) {
                    glyphs[c][gy as usize * SIDE + gx as usize]
                } else {
                    0.0
                };
                let noise = 1.2 * (rng.uniform() - 0.5);
                images.push((gain * v + noise).clamp(0.0, 1.0));
            }
        }
        labels.push(c as i32);
    }
    ImageSet {
        images,
        labels,
        side: SIDE,
        classes: CLASSES,
    }
}

fn idx_error(path: &Path, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "read_idx",
        msg: format!("{}: {}", path.display(), msg.into()),
    }
}

/// An IDX file of unsigned bytes (MNIST's format): its dims and data.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| idx_error(path, e.to_string()))?;
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(idx_error(path, "not an IDX file (bad magic)"));
    }
    if bytes[2] != 0x08 {
        return Err(idx_error(
            path,
            format!("element type {:#x}, only u8 (0x08) is read", bytes[2]),
        ));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(idx_error(path, "truncated header"));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| {
            u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize
        })
        .collect();
    let n: usize = dims.iter().product();
    if bytes.len() != header + n {
        return Err(idx_error(
            path,
            format!("{} data bytes for dims {dims:?}", bytes.len() - header),
        ));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// MNIST from `dir` (`{train,t10k}-images-idx3-ubyte` and `-labels-idx1-ubyte`): `train` or test.
pub fn read_mnist(dir: &Path, train: bool) -> Result<ImageSet> {
    let prefix = if train { "train" } else { "t10k" };
    let (dims, px) = read_idx(&dir.join(format!("{prefix}-images-idx3-ubyte")))?;
    let (ldims, labels) = read_idx(&dir.join(format!("{prefix}-labels-idx1-ubyte")))?;
    if dims.len() != 3 || dims[1] != dims[2] || ldims != [dims[0]] {
        return Err(idx_error(
            dir,
            format!("image dims {dims:?} and label dims {ldims:?}"),
        ));
    }
    Ok(ImageSet {
        images: px.iter().map(|&b| b as f32 / 255.0).collect(),
        labels: labels.iter().map(|&l| l as i32).collect(),
        side: dims[1],
        classes: 10,
    })
}
