//! PyTorch's size formatting for messages (`format_size`): two decimals, binary units; and
//! sizes as people write them (`parse_size`: `24GiB`, `80GB`, `512MiB`).

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

/// A size as a command line gives it: bytes, or a number with a unit (`KiB`, `MiB`, `GiB`,
/// `TiB` binary; `KB`, `MB`, `GB`, `TB` decimal; case and spaces ignored; `24GiB`, `1.5 GB`).
pub fn parse_size(text: &str) -> crate::Result<u64> {
    let t = text.trim().to_ascii_lowercase().replace(' ', "");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => u64::MAX,
    };
    match number.parse::<f64>() {
        Ok(n) if scale != u64::MAX && n >= 0.0 && (n * scale as f64) < u64::MAX as f64 => {
            Ok((n * scale as f64).round() as u64)
        }
        _ => Err(crate::Error::InvalidArgument {
            op: "parse_size",
            msg: format!("{text:?} is not a size (e.g. 24GiB, 80GB, 512MiB, 1048576)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{format_size, parse_size};

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("24GiB").unwrap(), 24 << 30);
        assert_eq!(parse_size("80 GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("1.5mib").unwrap(), 3 << 19);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("-1GiB").is_err());
    }

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
