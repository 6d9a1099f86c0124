//! Memory timelines without leaving kiln: a snapshot's trace drawn as PyTorch's "Active Memory
//! Timeline" draws it (pytorch.org/memory_viz, and the figures of PyTorch's memory blog): active
//! memory over trace events, one band per allocation stacked in allocation order (a freed band
//! lets those above it fall), coloured by the op or scope that made it, with the user's named
//! phases (`record_function("## forward ##")`, ...) shaded behind. Written as SVG and PNG with
//! the plotters crate.
//!
//! PNG text needs a font: kiln loads a TrueType font from `KILN_FONT` or the usual system places
//! (DejaVu, Liberation, Arial); without one the PNG has no labels (the SVG always has them).

use crate::alloc::{MemoryCategory, Snapshot, TraceAction};
use crate::base::write_atomic_with;
use crate::{Error, Result};
use plotters::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// One allocation's band: where its bottom edge sits from event to event.
#[derive(Clone, Debug)]
pub struct Band {
    /// Bytes of the allocation.
    pub size: u64,
    /// Index into `Timeline::categories`.
    pub category: usize,
    /// (event, bottom in bytes) at its allocation and at every change; ends at `end`.
    pub steps: Vec<(usize, u64)>,
    /// The event at which it was freed.
    pub end: usize,
}

/// The stacked layout of a trace.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// One band per allocation, in allocation order.
    pub bands: Vec<Band>,
    /// Category names (the innermost frame of an allocation), most memory-time first.
    pub categories: Vec<String>,
    /// Named phases: (name, first event, last event + 1).
    pub phases: Vec<(String, usize, usize)>,
    /// Active bytes after each event.
    pub active: Vec<u64>,
    /// Reserved bytes (the allocator's segments) after each event.
    pub reserved: Vec<u64>,
    /// The number of trace events.
    pub events: usize,
}

impl Timeline {
    /// The layout of `device`'s trace in `snapshot` (`alloc` adds a band on top,
    /// `free_completed` removes one; blocks freed before the trace saw them start at the bottom).
    pub fn from_snapshot(snapshot: &Snapshot, device: usize) -> Timeline {
        let Some(trace) = snapshot.device_traces.get(device) else {
            return Timeline::default();
        };
        let events: Vec<_> = trace
            .iter()
            .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::FreeCompleted))
            .collect();
        let mut cat_index: HashMap<String, usize> = HashMap::new();
        let mut cat_names: Vec<String> = Vec::new();
        let mut category = |name: &str| -> usize {
            *cat_index.entry(name.to_string()).or_insert_with(|| {
                cat_names.push(name.to_string());
                cat_names.len() - 1
            })
        };
        let mut bands: Vec<Band> = Vec::new();
        // Live bands bottom to top, and where each address's band is.
        let mut stack: Vec<usize> = Vec::new();
        let mut by_addr: HashMap<u64, usize> = HashMap::new();
        // Blocks freed before their allocation was traced were live from the start.
        let mut seen = std::collections::HashSet::new();
        let mut base = 0u64;
        let pre = category("allocated before the trace");
        for e in &events {
            let addr = e.addr.unwrap_or(0);
            match e.action {
                TraceAction::Alloc => {
                    seen.insert(addr);
                }
                _ if !seen.contains(&addr) && !by_addr.contains_key(&addr) => {
                    by_addr.insert(addr, bands.len());
                    stack.push(bands.len());
                    bands.push(Band {
                        size: e.size,
                        category: pre,
                        steps: vec![(0, base)],
                        end: events.len(),
                    });
                    base += e.size;
                }
                _ => {}
            }
        }
        // Reserved bytes along the same events: segments now, less what the trace added.
        let mut reserved_at = Vec::with_capacity(events.len());
        {
            let now: u64 = snapshot
                .segments
                .iter()
                .filter(|s| s.device as usize == device)
                .map(|s| s.total_size)
                .sum();
            let net: i64 = trace
                .iter()
                .map(|e| match e.action {
                    TraceAction::SegmentAlloc | TraceAction::SegmentMap => e.size as i64,
                    TraceAction::SegmentFree | TraceAction::SegmentUnmap => -(e.size as i64),
                    _ => 0,
                })
                .sum();
            let mut r = now as i64 - net;
            for e in trace {
                match e.action {
                    TraceAction::SegmentAlloc | TraceAction::SegmentMap => r += e.size as i64,
                    TraceAction::SegmentFree | TraceAction::SegmentUnmap => r -= e.size as i64,
                    TraceAction::Alloc | TraceAction::FreeCompleted => {
                        reserved_at.push(r.max(0) as u64)
                    }
                    _ => {}
                }
            }
        }
        let mut active = Vec::with_capacity(events.len());
        let mut top = base;
        let mut phases: Vec<(String, usize, usize)> = Vec::new();
        for (t, e) in events.iter().enumerate() {
            let addr = e.addr.unwrap_or(0);
            match e.action {
                TraceAction::Alloc => {
                    let frames = e.frames.as_deref().map(Vec::as_slice).unwrap_or(&[]);
                    let name = frames.first().map_or("no frames", |f| f.name.as_str());
                    // The phase: the outermost of the user's scopes (frames not made by kiln).
                    if let Some(p) = frames
                        .iter()
                        .rev()
                        .find(|f| !f.filename.starts_with("kiln"))
                    {
                        match phases.last_mut() {
                            Some((n, _, end)) if *n == p.name => *end = t + 1,
                            _ => phases.push((p.name.clone(), t, t + 1)),
                        }
                    }
                    let c = category(name);
                    by_addr.insert(addr, bands.len());
                    stack.push(bands.len());
                    bands.push(Band {
                        size: e.size,
                        category: c,
                        steps: vec![(t, top)],
                        end: events.len(),
                    });
                    top += e.size;
                }
                _ => {
                    if let Some(b) = by_addr.remove(&addr) {
                        bands[b].end = t;
                        let at = stack.iter().position(|&x| x == b).expect("live band");
                        stack.remove(at);
                        let size = bands[b].size;
                        for &above in &stack[at..] {
                            let bottom = bands[above].steps.last().expect("placed").1 - size;
                            bands[above].steps.push((t, bottom));
                        }
                        top -= size;
                    }
                }
            }
            active.push(top);
        }
        // Categories ordered by memory-time, most first.
        let mut weight = vec![0u128; cat_names.len()];
        for b in &bands {
            let start = b.steps[0].0;
            weight[b.category] += b.size as u128 * (b.end.saturating_sub(start) + 1) as u128;
        }
        let mut order: Vec<usize> = (0..cat_names.len()).collect();
        order.sort_by_key(|&c| std::cmp::Reverse(weight[c]));
        let mut rank = vec![0; cat_names.len()];
        for (r, &c) in order.iter().enumerate() {
            rank[c] = r;
        }
        for b in &mut bands {
            b.category = rank[b.category];
        }
        Timeline {
            bands,
            categories: order.iter().map(|&c| cat_names[c].clone()).collect(),
            phases,
            active,
            reserved: reserved_at,
            events: events.len(),
        }
    }

    /// The highest active bytes over the trace.
    pub fn peak(&self) -> u64 {
        self.active.iter().copied().max().unwrap_or(0)
    }

    /// Distinct phase names in order of first appearance.
    pub fn phase_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (n, _, _) in &self.phases {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
    }
}

/// Colours for the categories with the most memory-time; the rest are grey.
const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
];
const OTHER: RGBColor = RGBColor(170, 170, 170);
const PHASE_SHADES: [RGBColor; 4] = [
    RGBColor(225, 232, 250),
    RGBColor(250, 232, 215),
    RGBColor(222, 245, 222),
    RGBColor(245, 225, 245),
];

fn colour(category: usize) -> RGBColor {
    PALETTE.get(category).copied().unwrap_or(OTHER)
}

/// Size and title of a picture.
#[derive(Clone, Debug)]
pub struct TimelineOptions {
    /// The title drawn above the plot.
    pub title: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The device whose trace is drawn.
    pub device: usize,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            title: "Active memory timeline".into(),
            width: 1400,
            height: 700,
            device: 0,
        }
    }
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> Error {
    Error::InvalidArgument {
        op: "viz",
        msg: format!("drawing the timeline: {e}"),
    }
}

fn mib(bytes: f64) -> String {
    let m = bytes / (1u64 << 20) as f64;
    if m >= 100.0 {
        format!("{m:.0} MiB")
    } else if m >= 1.0 {
        format!("{m:.1} MiB")
    } else {
        format!("{:.0} KiB", bytes / 1024.0)
    }
}

/// The plot's left and bottom axes around (left, top, width, height), and its title if given.
fn axes<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    (left, top, pw, ph): (i32, i32, i32, i32),
    title: Option<&str>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    area.draw(&PathElement::new(
        vec![(left, top), (left, top + ph), (left + pw, top + ph)],
        BLACK.stroke_width(1),
    ))
    .map_err(draw_err)?;
    if let Some(title) = title {
        let font = ("sans-serif", 18).into_font();
        area.draw(&Text::new(
            title.to_string(),
            (left, 10),
            font.color(&BLACK),
        ))
        .map_err(draw_err)?;
    }
    Ok(())
}

/// The legend right of the plot at `(lx, top)`: the coloured categories, the reserved line,
/// "other", and the phases' shades.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    tl: &Timeline,
    names: &[String],
    (lx, top): (i32, i32),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let font = |size: u32| ("sans-serif", size).into_font();
    for (i, name) in tl.categories.iter().take(PALETTE.len()).enumerate() {
        let ly = top + 18 * i as i32;
        area.draw(&Rectangle::new(
            [(lx, ly), (lx + 12, ly + 12)],
            colour(i).filled(),
        ))
        .map_err(draw_err)?;
        let label: String = name.chars().take(26).collect();
        area.draw(&Text::new(label, (lx + 18, ly), font(12).color(&BLACK)))
            .map_err(draw_err)?;
    }
    let mut ly = top + 18 * tl.categories.len().min(PALETTE.len()) as i32;
    if tl.reserved.iter().any(|&r| r > 0) {
        area.draw(&PathElement::new(
            vec![(lx, ly + 6), (lx + 12, ly + 6)],
            BLACK.stroke_width(2),
        ))
        .map_err(draw_err)?;
        area.draw(&Text::new(
            "reserved (segments)",
            (lx + 18, ly),
            font(12).color(&BLACK),
        ))
        .map_err(draw_err)?;
        ly += 18;
    }
    if tl.categories.len() > PALETTE.len() {
        area.draw(&Rectangle::new(
            [(lx, ly), (lx + 12, ly + 12)],
            OTHER.filled(),
        ))
        .map_err(draw_err)?;
        area.draw(&Text::new("other", (lx + 18, ly), font(12).color(&BLACK)))
            .map_err(draw_err)?;
        ly += 18;
    }
    // Legend: the phases' shades.
    if !names.is_empty() {
        ly += 12;
        area.draw(&Text::new("phases", (lx, ly), font(12).color(&BLACK)))
            .map_err(draw_err)?;
        for (i, name) in names.iter().enumerate() {
            ly += 18;
            let shade = PHASE_SHADES[i % PHASE_SHADES.len()];
            area.draw(&Rectangle::new(
                [(lx, ly), (lx + 12, ly + 12)],
                shade.filled(),
            ))
            .map_err(draw_err)?;
            let label: String = name.chars().take(26).collect();
            area.draw(&Text::new(label, (lx + 18, ly), font(12).color(&BLACK)))
                .map_err(draw_err)?;
        }
    }
    Ok(())
}

/// Draws `tl` on `area`; text only where `text` (a bitmap needs a font for it).
fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    tl: &Timeline,
    opts: &TimelineOptions,
    text: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE).map_err(draw_err)?;
    let (w, h) = (opts.width as i32, opts.height as i32);
    let (left, right, top, bottom) = (80, 230, 40, 40);
    let (pw, ph) = ((w - left - right).max(10), (h - top - bottom).max(10));
    let events = tl.events.max(1) as f64;
    let top_bytes = tl
        .peak()
        .max(tl.reserved.iter().copied().max().unwrap_or(0));
    let peak = top_bytes.max(1) as f64 * 1.05;
    let x = |t: usize| left + (t as f64 / events * pw as f64).round() as i32;
    let y = |b: u64| top + ph - (b as f64 / peak * ph as f64).round() as i32;
    let font = |size: u32| ("sans-serif", size).into_font();
    // Phases behind everything, one light shade per phase name, labelled where wide enough.
    let names = tl.phase_names();
    for (name, s, e) in &tl.phases {
        let i = names.iter().position(|n| n == name).unwrap_or(0);
        let shade = PHASE_SHADES[i % PHASE_SHADES.len()];
        area.draw(&Rectangle::new(
            [(x(*s), top), (x(*e), top + ph)],
            shade.filled(),
        ))
        .map_err(draw_err)?;
        if text && x(*e) - x(*s) > 7 * name.len() as i32 {
            area.draw(&Text::new(
                name.clone(),
                (x(*s) + 3, top + 3),
                font(11).color(&BLACK),
            ))
            .map_err(draw_err)?;
        }
    }
    // One polygon per allocation: a staircase whose bottom falls when bands below are freed.
    for b in &tl.bands {
        let end = b.end.max(b.steps[0].0 + 1).min(tl.events);
        let mut lower = Vec::with_capacity(b.steps.len() * 2 + 1);
        for (i, &(t, bottom)) in b.steps.iter().enumerate() {
            if i > 0 {
                lower.push((x(t), y(b.steps[i - 1].1)));
            }
            lower.push((x(t), y(bottom)));
        }
        lower.push((x(end), y(b.steps.last().expect("placed").1)));
        let height = (b.size as f64 / peak * ph as f64).round() as i32;
        let upper: Vec<(i32, i32)> = lower
            .iter()
            .rev()
            .map(|&(px, py)| (px, py - height))
            .collect();
        let mut points = lower;
        points.extend(upper);
        area.draw(&Polygon::new(points, colour(b.category).filled()))
            .map_err(draw_err)?;
    }
    // Reserved memory (the allocator's segments) as a line over the bands.
    if tl.reserved.iter().any(|&r| r > 0) {
        let mut line = Vec::with_capacity(tl.reserved.len() * 2);
        for (t, &r) in tl.reserved.iter().enumerate() {
            if let Some(&(_, py)) = line.last() {
                line.push((x(t), py));
            }
            line.push((x(t), y(r)));
        }
        line.push((x(tl.events), y(*tl.reserved.last().expect("non-empty"))));
        area.draw(&PathElement::new(line, BLACK.stroke_width(2)))
            .map_err(draw_err)?;
    }
    let axis = BLACK.stroke_width(1);
    axes(
        area,
        (left, top, pw, ph),
        text.then_some(opts.title.as_str()),
    )?;
    if text {
        // Ticks at 1, 2 or 5 times a power of two's worth of KiB/MiB, about five of them.
        let raw = peak / 5.0;
        let unit = if raw >= (1u64 << 20) as f64 {
            (1u64 << 20) as f64
        } else {
            1024.0
        };
        let mag = 10f64.powf((raw / unit).max(1e-9).log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag * unit)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag * unit);
        for i in 0..=((peak / step) as usize) {
            let bytes = step * i as f64;
            let py = y(bytes as u64);
            area.draw(&PathElement::new(vec![(left - 5, py), (left, py)], axis))
                .map_err(draw_err)?;
            area.draw(&Text::new(mib(bytes), (4, py - 7), font(12).color(&BLACK)))
                .map_err(draw_err)?;
        }
        area.draw(&Text::new(
            format!(
                "trace events (alloc / free), {} in all; peak {}",
                tl.events,
                mib(tl.peak() as f64)
            ),
            (left, top + ph + 12),
            font(12).color(&BLACK),
        ))
        .map_err(draw_err)?;
        legend(area, tl, &names, (left + pw + 15, top))?;
    }
    area.present().map_err(draw_err)
}

/// A TrueType font for PNG labels, registered once as plotters' "sans-serif".
fn bitmap_font() -> bool {
    static FONT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FONT.get_or_init(|| {
        let mut candidates: Vec<std::path::PathBuf> = std::env::var_os("KILN_FONT")
            .map(|p| vec![p.into()])
            .unwrap_or_default();
        candidates.extend(
            [
                "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/TTF/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
                "/Library/Fonts/Arial.ttf",
                "/System/Library/Fonts/Supplemental/Arial.ttf",
                "C:\\Windows\\Fonts\\arial.ttf",
            ]
            .map(Into::into),
        );
        candidates.iter().any(|p| {
            std::fs::read(p).is_ok_and(|bytes| {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
            })
        })
    })
}

/// Writes the timeline of `snapshot` as an SVG.
pub fn write_timeline_svg(snapshot: &Snapshot, path: &Path, opts: &TimelineOptions) -> Result<()> {
    let tl = Timeline::from_snapshot(snapshot, opts.device);
    write_atomic_with("write_timeline_svg", path, |tmp| {
        let area = SVGBackend::new(tmp, (opts.width, opts.height)).into_drawing_area();
        draw(&area, &tl, opts, true)
    })
}

/// Writes the timeline of `snapshot` as a PNG (labels where a font is found).
pub fn write_timeline_png(snapshot: &Snapshot, path: &Path, opts: &TimelineOptions) -> Result<()> {
    let tl = Timeline::from_snapshot(snapshot, opts.device);
    write_atomic_with("write_timeline_png", path, |tmp| {
        let area = BitMapBackend::new(tmp, (opts.width, opts.height)).into_drawing_area();
        draw(&area, &tl, opts, bitmap_font())
    })
}

/// Writes `{stem}.svg` and `{stem}.png`.
pub fn write_timeline(snapshot: &Snapshot, stem: &Path, opts: &TimelineOptions) -> Result<()> {
    write_timeline_svg(snapshot, &stem.with_extension("svg"), opts)?;
    write_timeline_png(snapshot, &stem.with_extension("png"), opts)
}

/// PyTorch's colours for the memory timeline's categories (`_CATEGORY_TO_COLORS`), in
/// `MemoryCategory::ALL` order: darkgreen, goldenrod, black, mediumpurple, red, mediumblue,
/// royalblue, grey.
const CATEGORY_COLOURS: [RGBColor; 8] = [
    RGBColor(0, 100, 0),
    RGBColor(218, 165, 32),
    RGBColor(0, 0, 0),
    RGBColor(147, 112, 219),
    RGBColor(255, 0, 0),
    RGBColor(0, 0, 205),
    RGBColor(65, 105, 225),
    RGBColor(128, 128, 128),
];

/// A categorised memory timeline to draw: times (microseconds) and, after each, the bytes of
/// each `MemoryCategory::ALL` after a leading 0 (PyTorch's `[times, sizes]`).
pub struct CategorySeries<'a> {
    /// Microseconds of each point.
    pub times_us: &'a [i64],
    /// Bytes per category at each point, after a leading 0.
    pub sizes: &'a [[i64; 9]],
}

impl CategorySeries<'_> {
    /// The largest total over time.
    pub fn peak(&self) -> i64 {
        self.sizes
            .iter()
            .map(|s| s.iter().sum::<i64>())
            .max()
            .unwrap_or(0)
    }
}

/// The categorised timeline as PyTorch's `export_memory_timeline` draws it: one stacked band
/// per category (parameters at the bottom), over time in milliseconds.
fn draw_categories<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    tl: &CategorySeries,
    title: &str,
    (w, h): (u32, u32),
    text: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE).map_err(draw_err)?;
    let (left, right, top, bottom) = (80, 200, 40, 50);
    let (pw, ph) = (
        (w as i32 - left - right).max(10),
        (h as i32 - top - bottom).max(10),
    );
    let t0 = tl.times_us.first().copied().unwrap_or(0);
    let span = (tl.times_us.last().copied().unwrap_or(0) - t0).max(1) as f64;
    let peak = tl.peak().max(1) as f64 * 1.05;
    let x = |t: i64| left + ((t - t0) as f64 / span * pw as f64).round() as i32;
    let y = |b: f64| top + ph - (b / peak * ph as f64).round() as i32;
    let n = tl.times_us.len();
    // Cumulative tops per category at each time; each band holds its value until the next time.
    let mut below = vec![0f64; n];
    for (c, colour) in CATEGORY_COLOURS.iter().enumerate() {
        if tl.sizes.iter().all(|s| s[c + 1] == 0) {
            continue;
        }
        let mut upper = Vec::with_capacity(2 * n);
        let mut lower = Vec::with_capacity(2 * n);
        for (i, base) in below.iter_mut().enumerate() {
            let next = tl.times_us.get(i + 1).copied().unwrap_or(tl.times_us[i]);
            let lo = *base;
            let hi = lo + tl.sizes[i][c + 1].max(0) as f64;
            upper.push((x(tl.times_us[i]), y(hi)));
            upper.push((x(next), y(hi)));
            lower.push((x(tl.times_us[i]), y(lo)));
            lower.push((x(next), y(lo)));
            *base = hi;
        }
        lower.reverse();
        upper.extend(lower);
        area.draw(&Polygon::new(upper, colour.filled()))
            .map_err(draw_err)?;
    }
    let axis = BLACK.stroke_width(1);
    axes(area, (left, top, pw, ph), text.then_some(title))?;
    if !text {
        return area.present().map_err(draw_err);
    }
    let font = |size: u32| ("sans-serif", size).into_font();
    for i in 0..=5 {
        let bytes = peak / 1.05 * i as f64 / 5.0;
        let py = y(bytes);
        area.draw(&PathElement::new(vec![(left - 5, py), (left, py)], axis))
            .map_err(draw_err)?;
        area.draw(&Text::new(mib(bytes), (4, py - 7), font(12).color(&BLACK)))
            .map_err(draw_err)?;
    }
    for i in 0..=5 {
        let t = t0 + (span * i as f64 / 5.0) as i64;
        let px = x(t);
        area.draw(&PathElement::new(
            vec![(px, top + ph), (px, top + ph + 5)],
            axis,
        ))
        .map_err(draw_err)?;
        area.draw(&Text::new(
            format!("{:.1}", (t - t0) as f64 / 1e3),
            (px - 10, top + ph + 8),
            font(12).color(&BLACK),
        ))
        .map_err(draw_err)?;
    }
    area.draw(&Text::new(
        "Time (ms)",
        (left + pw / 2 - 30, top + ph + 28),
        font(13).color(&BLACK),
    ))
    .map_err(draw_err)?;
    let lx = left + pw + 15;
    for (i, cat) in MemoryCategory::ALL.iter().enumerate() {
        let ly = top + 18 * i as i32;
        area.draw(&Rectangle::new(
            [(lx, ly), (lx + 12, ly + 12)],
            CATEGORY_COLOURS[i].filled(),
        ))
        .map_err(draw_err)?;
        let label = if *cat == MemoryCategory::Unknown {
            "Unknown"
        } else {
            cat.name()
        };
        area.draw(&Text::new(label, (lx + 18, ly), font(12).color(&BLACK)))
            .map_err(draw_err)?;
    }
    area.present().map_err(draw_err)
}

/// Writes the categorised memory timeline as an SVG.
pub fn write_category_timeline_svg(tl: &CategorySeries, path: &Path, title: &str) -> Result<()> {
    let size = (1400, 700);
    write_atomic_with("export_memory_timeline", path, |tmp| {
        let area = SVGBackend::new(tmp, size).into_drawing_area();
        draw_categories(&area, tl, title, size, true)
    })
}

/// Writes the categorised memory timeline as a PNG (labels where a font is found).
pub fn write_category_timeline_png(tl: &CategorySeries, path: &Path, title: &str) -> Result<()> {
    let size = (1400, 700);
    write_atomic_with("export_memory_timeline", path, |tmp| {
        let area = BitMapBackend::new(tmp, size).into_drawing_area();
        draw_categories(&area, tl, title, size, bitmap_font())
    })
}
