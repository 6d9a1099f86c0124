//! `memory_summary()`: PyTorch's 75-column table, its unit rules and its row order.

use super::stats::{DeviceStats, Stat, StatArray};

const WIDTH: usize = 75;

/// Bytes: the unit is chosen from the reference value (the "all" row) of the column.
fn format_size(mut n: i64, reference: i64) -> String {
    let units = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = units[0];
    let mut r = reference as f64;
    for next in &units[1..] {
        if r < 768.0 * 1024.0 {
            break;
        }
        unit = next;
        n = n.div_euclid(1024);
        r /= 1024.0;
    }
    format!("{n:6} {unit}")
}

fn format_count(mut n: i64, reference: i64) -> String {
    let units = [" ", "K", "M"];
    let mut unit = units[0];
    let mut r = reference as f64;
    for next in &units[1..] {
        if r < 750.0 * 1000.0 {
            break;
        }
        unit = next;
        n = n.div_euclid(1000);
        r /= 1000.0;
    }
    format!("{n:7} {unit} ")
}

type Formatter = fn(i64, i64) -> String;

fn row(name: &str, s: &Stat, reference: &Stat, f: Formatter) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        f(s.current, reference.current),
        f(s.peak, reference.peak),
        f(s.allocated, reference.allocated),
        f(s.freed, reference.freed)
    )
}

/// Renders the summary. `title` replaces "PyTorch CUDA memory summary, device ID 0" and is
/// centred in the 75 columns; every other line is PyTorch's, byte for byte.
pub fn memory_summary(stats: &DeviceStats, title: &str, abbreviated: bool) -> String {
    let metrics: [(&str, &StatArray, Formatter); 9] = [
        ("Allocated memory", &stats.allocated_bytes, format_size),
        ("Active memory", &stats.active_bytes, format_size),
        ("Requested memory", &stats.requested_bytes, format_size),
        ("GPU reserved memory", &stats.reserved_bytes, format_size),
        (
            "Non-releasable memory",
            &stats.inactive_split_bytes,
            format_size,
        ),
        ("Allocations", &stats.allocation, format_count),
        ("Active allocs", &stats.active, format_count),
        ("GPU reserved segments", &stats.segment, format_count),
        ("Non-releasable allocs", &stats.inactive_split, format_count),
    ];
    let title: String = title.chars().take(WIDTH - 2).collect();
    let mut lines = vec![
        "=".repeat(WIDTH),
        format!("{title:^WIDTH$}"),
        "-".repeat(WIDTH),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (name, arr, f) in metrics {
        lines.push("-".repeat(WIDTH));
        let all = &arr.0[0];
        lines.push(row(name, all, all, f));
        if !abbreviated {
            lines.push(row("      from large pool", &arr.0[2], all, f));
            lines.push(row("      from small pool", &arr.0[1], all, f));
        }
    }
    for (name, s) in [
        ("Oversize allocations", &stats.oversize_allocations),
        ("Oversize GPU segments", &stats.oversize_segments),
    ] {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, s, s, format_count));
    }
    lines.push("=".repeat(WIDTH));
    format!("|{}|\n", lines.join("|\n|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_pytorch() {
        assert_eq!(format_size(319816704, 319816704), "312321 KiB");
        assert_eq!(format_size(2485125120, 2485125120), "  2370 MiB");
        assert_eq!(format_size(1024, 2485125120), "     0 MiB");
        assert_eq!(format_size(0, 0), "     0 B  ");
        assert_eq!(format_count(3, 3), "      3   ");
        assert_eq!(format_count(800_000, 800_000), "    800 K ");
    }

    #[test]
    fn every_line_is_75_columns() {
        let s = memory_summary(
            &DeviceStats::default(),
            "kiln memory summary, device 0",
            false,
        );
        for line in s.lines() {
            assert_eq!(line.chars().count(), WIDTH + 2, "{line}");
        }
        assert_eq!(s.lines().count(), 6 + 9 * 4 + 4 + 1);
    }
}
