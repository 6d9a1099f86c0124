//! PyTorch's size formatting for messages (`format_size`): two decimals, binary units.

/// `format_size` of c10: "512 bytes", "1024.00 KiB", "2.00 MiB", "79.18 GiB" (bounds inclusive).
pub fn format_size(n: u64) -> String {
    const KIB: u64 = 1024;
    if n <= KIB {
        format!("{n} bytes")
    } else if n <= KIB * KIB {
        format!("{:.2} KiB", n as f64 / KIB as f64)
    } else if n <= KIB * KIB * KIB {
        format!("{:.2} MiB", n as f64 / (KIB * KIB) as f64)
    } else {
        format!("{:.2} GiB", n as f64 / (KIB * KIB * KIB) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::format_size;

    #[test]
    fn matches_c10_format_size() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1048576), "1024.00 KiB");
        assert_eq!(format_size(2097152), "2.00 MiB");
        assert_eq!(format_size(200 * 1024 * 1024 * 1024), "200.00 GiB");
        assert_eq!(format_size(85017493504), "79.18 GiB");
    }
}
