//! Replays allocator traces recorded from PyTorch and compares kiln's statistics with them.
//!
//! `cargo run --release --example replay_trace -- tests/fixtures/*.json`

use kiln::alloc::replay::AllocTrace;
use std::process::ExitCode;

fn main() -> ExitCode {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: replay_trace FILE...");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for file in &files {
        let name = std::path::Path::new(file)
            .file_stem()
            .map_or(file.clone(), |s| s.to_string_lossy().into_owned());
        let outcome = std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|text| AllocTrace::from_json(&text).map_err(|e| e.to_string()))
            .and_then(|trace| trace.replay().map_err(|e| e.to_string()));
        match outcome {
            Ok(Ok(n)) => println!("PASS {name} ({n} events)"),
            Ok(Err(m)) => {
                println!("FAIL {name}: {m}");
                failed = true;
            }
            Err(e) => {
                println!("FAIL {name}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
