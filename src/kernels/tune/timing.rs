//! Timing one candidate of a tuned key: a warm-up run, then the best of three samples, each
//! repeating the run to fill [`SAMPLE`]; a warm-up that loses to the fastest warm-up so far
//! ends the candidate's timing (`Best`).

use crate::device::Device;
use crate::Result;
use std::time::{Duration, Instant};

/// A warm-up run this long is taken as the candidate's time (no further runs).
const SLOW: Duration = Duration::from_millis(250);

/// Time one timing sample aims at (repeats of short kernels fill it).
const SAMPLE: Duration = Duration::from_millis(8);

/// The most runs one sample repeats (a 20 us kernel fills [`SAMPLE`] with 400).
const MAX_REPS: u32 = 1024;

/// Runs of a candidate that fill one [`SAMPLE`], for runs of `per_run` seconds (at most
/// [`MAX_REPS`]).
fn sample_reps(per_run: f64) -> u32 {
    (SAMPLE.as_secs_f64() / per_run.max(1e-7)).clamp(1.0, MAX_REPS as f64) as u32
}

/// Seconds per run of `run` on `device` ([`timed_runs`]). `left`: what remains of the key's
/// budget.
pub(super) fn time_one(
    device: &Device,
    left: Duration,
    best: Best,
    mut run: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    timed_runs(left, best, |reps| {
        let t = match reps {
            // The warm-up's first launch compiles the candidate's pipeline while it is recorded
            // (up to half a second for a 128-tile product on NVIDIA's driver), before anything
            // is submitted: only the time after the recording, the GPU's, says whether the run
            // itself is slow. Counting the compilation made the H100 keep reg4x4 for
            // 512x4096x784 (0.65 ms) over the vec4 128-tile (0.1 ms), timed at 336 ms.
            None => {
                run()?;
                Instant::now()
            }
            Some(reps) => {
                let t = Instant::now();
                for _ in 0..reps {
                    run()?;
                }
                t
            }
        };
        device.synchronize()?;
        Ok(t.elapsed())
    })
}

/// The fastest warm-up of the candidates timed so far for a key, and whether the next one was
/// compiled before its warm-up (`pick_prepared`).
///
/// A warm-up is one run timed from its submission to the host's return from the
/// synchronisation, so it holds the submission's and the wake-up's latency (50-100 us on the
/// H100) besides the run. Warm-ups are judged against warm-ups, not against the samples' time
/// per run: judged against the first candidate's 21 us per run, every other candidate of the
/// H100's head product (`h @ W^T`, 512x10 by K = 4096) lost on its warm-up alone, 50-100 us
/// of mostly latency, whatever its kernel's time.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Best {
    pub(super) warm: Option<f64>,
    pub(super) compiled: bool,
}

impl Best {
    /// Whether a warm-up of `d` loses to the fastest warm-up by more than noise: the candidate
    /// is not timed further.
    fn beaten(&self, d: Duration) -> bool {
        self.warm.is_some_and(|f| d.as_secs_f64() > LOSER * f)
    }
}

/// A candidate's seconds per run, and its warm-up's (`Best::warm`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Timing {
    pub(super) secs: f64,
    pub(super) warm: f64,
}

/// A warm-up this many times slower than the fastest candidate so far ends the candidate's
/// timing: its samples could not make it win. On lavapipe the split-K head product's losers
/// (102, 123 and 399 ms against 52) took 0.6 s of its 1.9 s of tuning with a second run each.
const LOSER: f64 = 2.0;

/// Seconds per run, from `measure`: `measure(None)` times a warm-up run from its submission,
/// `measure(Some(reps))` the recording and running of `reps` runs. One warm-up (which compiles
/// the pipeline unless `best.compiled`), then the best of three samples, each repeating the
/// run to fill [`SAMPLE`] (one sample of one run where a run alone takes longer). A warm-up
/// `best` beats (a second one, where the first compiled) is the candidate's time.
fn timed_runs(
    left: Duration,
    best: Best,
    mut measure: impl FnMut(Option<u32>) -> Result<Duration>,
) -> Result<Timing> {
    let mut warm = measure(None)?;
    // Mesa's llvmpipe compiles a shader at its first dispatch, on its own threads: the
    // warm-up's GPU time holds the compilation (0.65-0.76 s for lavapipe's 16-row word product,
    // which then runs in 3 ms, so that a 10 ms kernel won the MLP's first layer). Where the
    // budget allows, a slow warm-up is run again, and the second is the warm-up.
    let suspect = warm >= SLOW || (best.beaten(warm) && !best.compiled);
    if suspect && warm * 2 <= left {
        warm = warm.min(measure(None)?);
    }
    if warm >= SLOW || best.beaten(warm) || (best.compiled && warm >= SAMPLE) {
        // Compilation is a small part of so long a run, the candidate has lost, or it was
        // compiled before (its warm-up a clean run, one sample long): the warm-up is the
        // measurement.
        let secs = warm.as_secs_f64();
        return Ok(Timing { secs, warm: secs });
    }
    let warm = warm.as_secs_f64();
    let once = measure(Some(1))?.max(Duration::from_micros(1));
    if once >= SAMPLE {
        // A slow candidate is timed once: repeats would only spend the budget that the
        // remaining candidates need (GL's tiled transpose: 0.4 s a run on llvmpipe).
        let secs = once.as_secs_f64();
        return Ok(Timing { secs, warm });
    }
    // Each sample repeats the run to fill SAMPLE, judged by the previous sample's time per
    // run, so that the host's synchronisation is spread over enough runs. Judged by the
    // first run alone (one run and one synchronisation, which the host can slow many times
    // over), every sample could be a few runs of a 20 us kernel and mostly synchronisation:
    // the H100's head product (about 20 us in the step) was once tuned at 0.116 ms.
    let mut per_run = once.as_secs_f64();
    let mut best = per_run;
    for _ in 0..3 {
        let reps = sample_reps(per_run);
        per_run = measure(Some(reps))?.as_secs_f64() / reps as f64;
        best = best.min(per_run);
    }
    Ok(Timing { secs: best, warm })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first run slowed by compilation (llvmpipe compiles at the first dispatch) is run
    /// again where the budget allows, and the candidate is timed by its real runs; without the
    /// budget the slow warm-up is the measurement.
    #[test]
    fn a_warm_up_slowed_by_compilation_is_run_again_within_the_budget() {
        let timed = |left: Duration| {
            let mut runs = 0;
            // 300 ms for the first run, 2 ms a run after it.
            let secs = timed_runs(left, Best::default(), |reps| {
                let n = reps.unwrap_or(1);
                let ms = if runs == 0 { 298 + 2 * n } else { 2 * n };
                runs += n;
                Ok(Duration::from_millis(ms as u64))
            })
            .unwrap()
            .secs;
            (secs, runs)
        };
        let (secs, runs) = timed(Duration::from_secs(2));
        assert_eq!(secs, 0.002);
        assert!(runs > 2, "{runs} runs");
        let (secs, runs) = timed(Duration::from_millis(500));
        assert_eq!(secs, 0.3);
        assert_eq!(runs, 1);
    }

    /// A candidate whose warm-up is more than LOSER times the fastest so far is not sampled;
    /// where its warm-up also compiled it, the warm-up is run once more first, and a candidate
    /// fast after its compilation is sampled as usual.
    #[test]
    fn a_beaten_warm_up_ends_the_candidates_timing() {
        let left = Duration::from_secs(2);
        let count = |best: Best, first_ms: u64, ms: u64| {
            let mut runs = 0;
            let secs = timed_runs(left, best, |reps| {
                let n = reps.unwrap_or(1);
                let t = if runs == 0 {
                    first_ms + ms * (n as u64 - 1)
                } else {
                    ms * n as u64
                };
                runs += n;
                Ok(Duration::from_millis(t))
            })
            .unwrap()
            .secs;
            (secs, runs)
        };
        let best = |warm, compiled| Best { warm, compiled };
        // Compiled before, a warm-up as long as a sample is a sample.
        assert_eq!(count(best(None, true), 10, 10), (0.010, 1));
        let compiled = best(Some(0.004), true);
        assert_eq!(count(compiled, 10, 10), (0.010, 1));
        // Within LOSER: sampled.
        let (secs, runs) = count(compiled, 6, 6);
        assert_eq!(secs, 0.006);
        assert!(runs > 2, "{runs} runs");
        let first = best(Some(0.004), false);
        assert_eq!(count(first, 10, 10), (0.010, 2));
        let (secs, runs) = count(first, 200, 3);
        assert_eq!(secs, 0.003);
        assert!(runs > 3, "{runs} runs");
    }

    /// A short kernel's warm-up is mostly the submission's and the synchronisation's latency:
    /// a candidate is beaten by the fastest warm-up so far, not by the fastest time per run
    /// (the H100's head product: 21 us a run, warm-ups of 50-100 us).
    #[test]
    fn a_short_candidate_is_judged_by_warm_ups_against_warm_ups() {
        let left = Duration::from_secs(2);
        // 80 us of latency in every measurement, 10 us a run.
        let run = |reps: Option<u32>| Ok(Duration::from_micros(80 + 10 * reps.unwrap_or(1) as u64));
        // The first candidate's warm-up took 101 us (21 us a run): this one's 90 us is no loss,
        // and its samples find its 10 us.
        let best = |warm| Best {
            warm: Some(warm),
            compiled: true,
        };
        let t = timed_runs(left, best(101e-6), run).unwrap();
        assert!(t.secs < 11e-6, "{t:?}");
        assert_eq!(t.warm, 90e-6);
        // A warm-up more than LOSER times the fastest warm-up still ends the timing.
        let t = timed_runs(left, best(40e-6), run).unwrap();
        assert_eq!(
            t,
            Timing {
                secs: 90e-6,
                warm: 90e-6
            }
        );
    }

    #[test]
    fn a_sample_fills_its_time_within_the_cap() {
        assert_eq!(sample_reps(20e-6), 400);
        assert_eq!(sample_reps(0.5), 1);
        assert_eq!(sample_reps(1e-9), MAX_REPS);
        // A sample judged by a slowed first run repeats few runs; the next, judged by that
        // sample's own time per run, fills SAMPLE.
        assert_eq!(sample_reps(2e-3), 4);
        assert_eq!(sample_reps((4.0 * 20e-6 + 300e-6) / 4.0), 84);
    }
}
