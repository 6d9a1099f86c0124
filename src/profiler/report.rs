//! The profiler's outputs: `key_averages().table()` in PyTorch's layout and a Chrome trace
//! (Perfetto, chrome://tracing) with scopes, kernels, copies and allocator events on their own
//! tracks.

use super::{EventKind, Profile};
use std::collections::BTreeMap;

/// Totals of one name over all its calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Averages {
    /// The key (the event's name).
    pub name: String,
    /// How many events share it.
    pub calls: usize,
    /// CPU time outside child scopes, in microseconds.
    pub self_cpu_us: f64,
    /// CPU time in all.
    pub cpu_total_us: f64,
    /// GPU time of its own kernels.
    pub self_gpu_us: f64,
    /// GPU time in all.
    pub gpu_total_us: f64,
    /// Host memory, children excluded.
    pub self_cpu_mem: i64,
    /// Host memory.
    pub cpu_mem: i64,
    /// Device memory, children excluded.
    pub self_gpu_mem: i64,
    /// Device memory.
    pub gpu_mem: i64,
    /// Input shapes, when grouped by them.
    pub shapes: String,
    /// A kernel or copy (whose GPU times make the GPU total), not a scope.
    pub on_device: bool,
}

/// `prof.key_averages()`.
pub struct KeyAverages {
    /// One row per key, as the table prints them.
    pub rows: Vec<Averages>,
    /// Whether GPU times come from timestamp queries (else they are not measured).
    pub gpu_measured: bool,
}

fn fmt_time(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.3}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3}ms", us / 1e3)
    } else {
        format!("{us:.3}us")
    }
}

/// PyTorch's profiler memory format (`Mb` for MiB).
fn fmt_mem(b: i64) -> String {
    let (kb, mb, gb) = (1024f64, 1024f64 * 1024.0, 1024f64 * 1024.0 * 1024.0);
    let a = b.abs() as f64;
    if a >= gb {
        format!("{:.2} Gb", b as f64 / gb)
    } else if a >= mb {
        format!("{:.2} Mb", b as f64 / mb)
    } else if a >= kb {
        format!("{:.2} Kb", b as f64 / kb)
    } else {
        format!("{b} b")
    }
}

impl Profile {
    /// Events grouped by name (and by input shapes with `group_by_input_shape`).
    pub fn key_averages_by(&self, group_by_input_shape: bool) -> KeyAverages {
        let mut groups: BTreeMap<(String, String), Averages> = BTreeMap::new();
        for e in &self.events {
            if matches!(e.kind, EventKind::Memory) {
                continue;
            }
            let shapes = if group_by_input_shape {
                e.shapes.clone()
            } else {
                String::new()
            };
            let a = groups
                .entry((e.name.clone(), shapes.clone()))
                .or_insert_with(|| Averages {
                    name: e.name.clone(),
                    shapes,
                    on_device: matches!(e.kind, EventKind::Kernel | EventKind::Copy),
                    ..Default::default()
                });
            a.calls += 1;
            a.self_cpu_us += e.self_cpu_us;
            a.cpu_total_us += e.cpu_dur_us;
            a.self_gpu_us += e.self_gpu_us;
            a.gpu_total_us += e.gpu_total_us;
            a.self_cpu_mem += e.self_cpu_mem;
            a.cpu_mem += e.cpu_mem;
            a.self_gpu_mem += e.self_gpu_mem;
            a.gpu_mem += e.gpu_mem;
        }
        KeyAverages {
            rows: groups.into_values().collect(),
            gpu_measured: self.gpu_measured,
        }
    }

    /// `prof.key_averages()`: events grouped by name.
    pub fn key_averages(&self) -> KeyAverages {
        self.key_averages_by(false)
    }

    /// Writes the Chrome trace JSON (`prof.export_chrome_trace(path)`).
    pub fn export_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> crate::Result<()> {
        let path = path.as_ref();
        crate::base::write_atomic(
            "export_chrome_trace",
            path,
            self.chrome_trace_json().as_bytes(),
        )
    }

    /// The Chrome trace as a JSON value: CPU scopes on process 0 (one track per thread); per
    /// device, kernels on track 0, copies on track 1, allocator events on track 2 and a
    /// `memory allocated` counter.
    pub fn chrome_trace(&self) -> serde_json::Value {
        use serde_json::json;
        let mut ev =
            vec![json!({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "CPU"}})];
        for (i, d) in self.devices.iter().enumerate() {
            let pid = i + 1;
            ev.push(json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": format!("GPU {d}")}}));
            for (tid, name) in [(0, "kernels"), (1, "copies"), (2, "allocator")] {
                ev.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}));
            }
        }
        let mut allocated: BTreeMap<usize, i64> = BTreeMap::new();
        for e in &self.events {
            let pid = e.device.map_or(0, |d| d + 1);
            match e.kind {
                EventKind::Scope | EventKind::UserScope => ev.push(json!({
                    "ph": "X", "name": e.name,
                    "cat": if matches!(e.kind, EventKind::UserScope) { "user_annotation" } else { "cpu_op" },
                    "pid": 0, "tid": e.thread, "ts": e.cpu_start_us, "dur": e.cpu_dur_us,
                    "args": {"Input Dims": e.shapes, "Self CPU us": e.self_cpu_us},
                })),
                EventKind::Kernel | EventKind::Copy => {
                    let copy = matches!(e.kind, EventKind::Copy);
                    let (ts, dur) = match (e.gpu_start_us, self.gpu_measured || copy) {
                        (Some(s), true) => (s, e.gpu_total_us),
                        _ => (e.cpu_start_us, e.cpu_dur_us),
                    };
                    ev.push(json!({
                        "ph": "X", "name": e.name, "cat": if copy { "gpu_memcpy" } else { "kernel" },
                        "pid": pid, "tid": if copy { 1 } else { 0 }, "ts": ts, "dur": dur,
                        "args": {"bytes": e.bytes, "launched at us": e.cpu_start_us},
                    }));
                }
                EventKind::Memory => {
                    let total = allocated.entry(pid).or_insert(0);
                    *total += e.bytes;
                    ev.push(json!({
                        "ph": "i", "s": "t", "name": if e.bytes >= 0 { "alloc" } else { "free" },
                        "cat": "allocator", "pid": pid, "tid": 2, "ts": e.cpu_start_us,
                        "args": {"bytes": e.bytes},
                    }));
                    ev.push(json!({
                        "ph": "C", "name": "memory allocated", "pid": pid, "ts": e.cpu_start_us,
                        "args": {"bytes": *total},
                    }));
                }
            }
        }
        json!({"traceEvents": ev, "displayTimeUnit": "ms"})
    }

    /// `export_chrome_trace`'s JSON, as a string.
    pub fn chrome_trace_json(&self) -> String {
        serde_json::to_string(&self.chrome_trace()).expect("plain data")
    }
}

impl KeyAverages {
    /// PyTorch's table: `sort_by` one of `self_cpu_time_total`, `cpu_time_total`,
    /// `self_gpu_time_total` (or `self_cuda_time_total`), `gpu_time_total`
    /// (`cuda_time_total`), `cpu_memory_usage`, `self_cpu_memory_usage`, `gpu_memory_usage`
    /// (`cuda_memory_usage`), `self_gpu_memory_usage`, `count`; at most `row_limit` rows.
    pub fn table(&self, sort_by: &str, row_limit: usize) -> String {
        let mut rows: Vec<&Averages> = self.rows.iter().collect();
        let key = |a: &Averages| -> f64 {
            match sort_by {
                "cpu_time_total" => a.cpu_total_us,
                "self_gpu_time_total" | "self_cuda_time_total" => a.self_gpu_us,
                "gpu_time_total" | "cuda_time_total" => a.gpu_total_us,
                "cpu_memory_usage" => a.cpu_mem as f64,
                "self_cpu_memory_usage" => a.self_cpu_mem as f64,
                "gpu_memory_usage" | "cuda_memory_usage" => a.gpu_mem as f64,
                "self_gpu_memory_usage" | "self_cuda_memory_usage" => a.self_gpu_mem as f64,
                "count" => a.calls as f64,
                _ => a.self_cpu_us,
            }
        };
        rows.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.name.cmp(&b.name)));
        rows.truncate(row_limit);
        let self_cpu: f64 = self.rows.iter().map(|a| a.self_cpu_us).sum();
        // Kernels and copies only: a scope's self GPU time is its kernels' (as in PyTorch).
        let self_gpu: f64 = self
            .rows
            .iter()
            .filter(|a| a.on_device)
            .map(|a| a.self_gpu_us)
            .sum();
        let pct = |x: f64, of: f64| {
            if of > 0.0 {
                format!("{:.2}%", 100.0 * x / of)
            } else {
                "0.00%".into()
            }
        };
        let name_w = rows
            .iter()
            .map(|a| a.name.len())
            .max()
            .unwrap_or(4)
            .clamp(20, 55);
        let shapes = self.rows.iter().any(|a| !a.shapes.is_empty());
        let mut headers = vec![
            "Name",
            "Self CPU %",
            "Self CPU",
            "CPU total %",
            "CPU total",
            "CPU time avg",
            "Self GPU",
            "Self GPU %",
            "GPU total",
            "GPU time avg",
            "CPU Mem",
            "Self CPU Mem",
            "GPU Mem",
            "Self GPU Mem",
            "# of Calls",
        ];
        if shapes {
            headers.push("Input Shapes");
        }
        let widths: Vec<usize> = headers
            .iter()
            .enumerate()
            .map(|(i, _)| match i {
                0 => name_w,
                15 => 40,
                _ => 12,
            })
            .collect();
        let line: String = widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ");
        let fmt_row = |cells: Vec<String>| -> String {
            cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    let c: String = if c.len() > *w {
                        c.chars().take(w - 3).collect::<String>() + "..."
                    } else {
                        c.clone()
                    };
                    if i == 0 || i == 15 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        let mut out = format!(
            "{line}\n{}\n{line}\n",
            fmt_row(headers.iter().map(|h| h.to_string()).collect())
        );
        let gpu = |us: f64| {
            if self.gpu_measured {
                fmt_time(us)
            } else {
                "-".into()
            }
        };
        for a in rows {
            let mut cells = vec![
                a.name.clone(),
                pct(a.self_cpu_us, self_cpu),
                fmt_time(a.self_cpu_us),
                pct(a.cpu_total_us, self_cpu),
                fmt_time(a.cpu_total_us),
                fmt_time(a.cpu_total_us / a.calls.max(1) as f64),
                gpu(a.self_gpu_us),
                if self.gpu_measured {
                    pct(a.self_gpu_us, self_gpu)
                } else {
                    "-".into()
                },
                gpu(a.gpu_total_us),
                gpu(a.gpu_total_us / a.calls.max(1) as f64),
                fmt_mem(a.cpu_mem),
                fmt_mem(a.self_cpu_mem),
                fmt_mem(a.gpu_mem),
                fmt_mem(a.self_gpu_mem),
                a.calls.to_string(),
            ];
            if shapes {
                cells.push(a.shapes.clone());
            }
            out += &fmt_row(cells);
            out += "\n";
        }
        out += &format!("{line}\nSelf CPU time total: {}\n", fmt_time(self_cpu));
        if self.gpu_measured {
            out += &format!("Self GPU time total: {}\n", fmt_time(self_gpu));
        } else {
            out += "GPU time: not measured (no device profiled, or the adapter has no timestamp queries inside compute passes); CPU times only\n";
        }
        out
    }
}
