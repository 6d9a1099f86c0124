//! Atomic file writes. Every file kiln writes (state dicts and checkpoints, snapshots, traces,
//! timelines) is written to a temporary file in the target's directory, flushed to disk, and
//! renamed over the target, then the directory entry is flushed too. A crash, a kill or a full
//! disk at any moment leaves the old file or the new one at the path, never a torn one (rename
//! within one directory is atomic on POSIX file systems and on NTFS).

use super::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// `Error::Io` for `path`, with the OS's reason.
pub(crate) fn io_error(op: &'static str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        op,
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

/// `.{name}.{pid}-{n}.tmp{.ext}` beside `path`: unique per process and call, hidden, and with
/// the target's extension last, because some writers (plotters' bitmap backend) pick the format
/// from it.
fn temporary_beside(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}-{n}.tmp{ext}", std::process::id()))
}

/// Runs `write` on a temporary path beside `path`, then makes its file durable and moves it over
/// `path` in one rename. On any error the temporary file is removed and `path` is untouched.
pub(crate) fn write_atomic_with(
    op: &'static str,
    path: &Path,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let tmp = temporary_beside(path);
    let finish = || -> Result<()> {
        write(&tmp)?;
        // The data must reach the disk before the rename makes it the file at `path`.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_error(op, &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io_error(op, path, e))?;
        sync_parent(path);
        Ok(())
    };
    let result = finish();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `bytes` to `path` atomically.
pub(crate) fn write_atomic(op: &'static str, path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(op, path, |tmp| {
        let mut f = std::fs::File::create(tmp).map_err(|e| io_error(op, tmp, e))?;
        f.write_all(bytes).map_err(|e| io_error(op, tmp, e))
    })
}

/// Flushes the directory entry of a rename (POSIX); elsewhere the rename is already durable or
/// directories cannot be opened, and a failure here cannot tear the file, so it is ignored.
fn sync_parent(path: &Path) {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("kiln-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.bin");
        write_atomic("test", &path, b"old").unwrap();
        let failed = write_atomic_with("test", &path, |tmp| {
            std::fs::write(tmp, b"half").unwrap();
            Err(Error::InvalidArgument {
                op: "test",
                msg: "disk full".into(),
            })
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        write_atomic("test", &path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the target remains: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
