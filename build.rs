//! The kernels' fingerprint: a hash of the sources that decide what a kernel variant's name
//! means (`shaders/`, `src/`), which the autotuning cache keys its choices by beside the
//! adapter, the driver and kiln's version. A build that changes a kernel under an old name (the
//! word products' workgroup went from 8x8 to 8x1 on 2026-11-26) must measure it
//! again, not keep the winner chosen for the old kernel.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

fn main() {
    let mut files = Vec::new();
    for dir in ["shaders", "src"] {
        println!("cargo:rerun-if-changed={dir}");
        collect(Path::new(dir), &mut files);
    }
    files.sort();
    // `DefaultHasher::new()` hashes alike in every instance: the same sources (and compiler)
    // give the same fingerprint.
    let mut h = std::hash::DefaultHasher::new();
    for f in &files {
        f.to_string_lossy().hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    println!("cargo:rustc-env=KILN_KERNEL_HASH={:016x}", h.finish());
}

/// Every file under `dir`.
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            collect(&path, files);
        } else {
            files.push(path);
        }
    }
}
