//! Allocator configuration: the typed form and the `KILN_ALLOC_CONF` string in
//! `PYTORCH_CUDA_ALLOC_CONF` syntax (`max_split_size_mb:40,roundup_power2_divisions:4`).

use crate::{Error, Result};

pub(crate) const MIB: u64 = 1024 * 1024;
/// Number of power-of-two size intervals that `roundup_power2_divisions` configures
/// (interval 0 is [0, 2 MiB), interval 15 is >= 32 GiB).
pub const ROUNDUP_INTERVALS: usize = 16;

/// The caching allocator's settings. `Default` is PyTorch's default.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks this size or larger are never split ("oversize"); `u64::MAX` = unlimited.
    pub max_split_size: u64,
    /// How much larger than the request an oversize cached block may be and still be reused.
    pub max_non_split_rounding: u64,
    /// Fraction in (0, 1) of the memory limit above which cached large blocks are reclaimed
    /// by age before a new segment is created; 0 = off. Armed only when a limit is set.
    pub garbage_collection_threshold: f64,
    /// Divisions per power-of-two interval (index = floor(log2 size) - 20, clamped); 0 or 1 = off.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Segment size for large-pool requests below 10 MiB (PyTorch's kLargeBuffer, 20 MiB).
    pub large_segment_size: u64,
    /// PyTorch's `expandable_segments`: one reserved range per pool with pages mapped on
    /// demand (`caching/expandable.rs`), where the segment source can map pages; elsewhere the
    /// allocator warns once and uses ordinary segments.
    pub expandable_segments: bool,
    /// The last configuration string parsed, as `allocator_settings` reports it.
    pub source: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 * MIB,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            large_segment_size: 20 * MIB,
            expandable_segments: false,
            source: String::new(),
        }
    }
}

fn bad(msg: String) -> Error {
    Error::AllocConfig(msg)
}

fn parse_u64(key: &str, v: &str) -> Result<u64> {
    v.trim().parse::<u64>().map_err(|_| {
        bad(format!(
            "value {v:?} for {key} is not a non-negative integer"
        ))
    })
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v.trim() {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(bad(format!("value {v:?} for {key} must be True or False"))),
    }
}

fn interval_of_mb(key: &str, mb: &str) -> Result<usize> {
    let mb = parse_u64(key, mb)?;
    if mb == 0 || !mb.is_power_of_two() {
        return Err(bad(format!(
            "{key}: interval start {mb} MB must be a power of two"
        )));
    }
    Ok((mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1))
}

fn divisions(key: &str, v: &str) -> Result<u64> {
    let d = parse_u64(key, v)?;
    if d != 0 && !d.is_power_of_two() {
        return Err(bad(format!("{key}: divisions {d} must be a power of two")));
    }
    Ok(d)
}

/// Splits "k:v,k:[a:b,c:d]" at the commas that are not inside brackets.
fn top_level_items(s: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&s[start..]);
    items.into_iter().filter(|t| !t.trim().is_empty()).collect()
}

impl AllocatorConfig {
    /// Parses PyTorch's syntax. As in PyTorch, every parse starts from the defaults.
    pub fn parse(conf: &str) -> Result<Self> {
        let mut cfg = AllocatorConfig {
            source: conf.to_string(),
            ..Default::default()
        };
        let compact: String = conf.chars().filter(|c| !c.is_whitespace()).collect();
        for item in top_level_items(&compact) {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| bad(format!("item {item:?} is not key:value")))?;
            match key {
                "max_split_size_mb" => {
                    let mb = parse_u64(key, value)?;
                    if mb < 20 {
                        return Err(bad(format!(
                            "CachingAllocator option max_split_size_mb too small, must be >= 20 (got {mb})"
                        )));
                    }
                    cfg.max_split_size = mb.saturating_mul(MIB);
                }
                "max_non_split_rounding_mb" => {
                    let mb = parse_u64(key, value)?;
                    if mb < 20 {
                        return Err(bad(format!("{key} too small, must be >= 20 (got {mb})")));
                    }
                    cfg.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "large_segment_size_mb" => {
                    let mb = parse_u64(key, value)?;
                    if mb < 2 || mb % 2 != 0 {
                        return Err(bad(format!("{key} must be an even number >= 2 (got {mb})")));
                    }
                    cfg.large_segment_size = mb * MIB;
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| bad(format!("value {value:?} for {key} is not a number")))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(format!(
                            "garbage_collect_threshold too small/big, set it 0.0~1.0 (got {t})"
                        )));
                    }
                    cfg.garbage_collection_threshold = t;
                }
                "roundup_power2_divisions" => cfg.parse_roundup(value)?,
                "expandable_segments" => cfg.expandable_segments = parse_bool(key, value)?,
                // Accepted and without effect in kiln (no CUDA driver lock, no cudaHostRegister).
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse" => {
                    parse_bool(key, value)?;
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    parse_u64(key, value)?;
                }
                "backend" if value == "native" => {}
                _ => {
                    return Err(bad(format!(
                        "Unrecognized key '{key}' in Accelerator allocator config."
                    )))
                }
            }
        }
        Ok(cfg)
    }

    /// Reads `KILN_ALLOC_CONF`; the defaults when it is unset.
    pub fn from_env() -> Result<Self> {
        match std::env::var("KILN_ALLOC_CONF") {
            Ok(s) => Self::parse(&s),
            Err(_) => Ok(Self::default()),
        }
    }

    fn parse_roundup(&mut self, value: &str) -> Result<()> {
        const KEY: &str = "roundup_power2_divisions";
        let Some(list) = value.strip_prefix('[') else {
            let d = divisions(KEY, value)?;
            self.roundup_power2_divisions = [d; ROUNDUP_INTERVALS];
            return Ok(());
        };
        let list = list
            .strip_suffix(']')
            .ok_or_else(|| bad(format!("{KEY}: unterminated list {value:?}")))?;
        let mut last: Option<usize> = None;
        for entry in list.split(',').filter(|e| !e.is_empty()) {
            let (k, v) = entry
                .split_once(':')
                .ok_or_else(|| bad(format!("{KEY}: entry {entry:?} is not interval:divisions")))?;
            let d = divisions(KEY, v)?;
            if k == ">" {
                let from = last.map_or(0, |i| i + 1);
                for slot in &mut self.roundup_power2_divisions[from..] {
                    *slot = d;
                }
                continue;
            }
            let i = interval_of_mb(KEY, k)?;
            if last.is_none() {
                // The first entry also covers every interval below it.
                for slot in &mut self.roundup_power2_divisions[..i] {
                    *slot = d;
                }
            }
            self.roundup_power2_divisions[i] = d;
            last = Some(i);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_examples() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:40, roundup_power2_divisions:4,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 40 * MIB);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.garbage_collection_threshold, 0.6);

        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(
            &c.roundup_power2_divisions[..8],
            &[1, 1, 1, 1, 1, 1, 1, 1][..]
        );
        assert_eq!(c.roundup_power2_divisions[8], 1); // 256 MB
        assert_eq!(c.roundup_power2_divisions[9], 2); // 512 MB
        assert_eq!(c.roundup_power2_divisions[10], 4); // 1024 MB
        assert_eq!(&c.roundup_power2_divisions[11..], &[8; 5][..]);
    }

    #[test]
    fn rejects_bad_input_with_clear_messages() {
        let e = AllocatorConfig::parse("max_split_size_mb:10")
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be >= 20"), "{e}");
        let e = AllocatorConfig::parse("foo:1").unwrap_err().to_string();
        assert!(e.contains("Unrecognized key 'foo'"), "{e}");
        let e = AllocatorConfig::parse("garbage_collection_threshold:1.5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.0~1.0"), "{e}");
        assert!(AllocatorConfig::parse("roundup_power2_divisions:3").is_err());
        assert!(AllocatorConfig::parse("max_split_size_mb:abc").is_err());
        assert!(
            AllocatorConfig::parse("expandable_segments:True")
                .unwrap()
                .expandable_segments
        );
        assert!(AllocatorConfig::parse("max_split_size_mb").is_err());
        assert_eq!(AllocatorConfig::parse("").unwrap().max_split_size, u64::MAX);
    }
}
