//! The SVG plots: bus bandwidth against size, efficiency against replicas.

use super::*;

/// One line of a plot.
#[derive(Clone, Debug)]
pub(super) struct Line {
    pub(super) label: String,
    pub(super) points: Vec<(f64, f64)>,
    /// Measured lines are solid with markers; modelled ones dashed.
    pub(super) measured: bool,
    pub(super) color: RGBColor,
}

/// Distinct colours (Tableau 10, then darker variants).
pub(super) const COLORS: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(0, 0, 0),
];

pub(super) fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Draws `lines` on `chart` (measured ones solid with dots, modelled ones dashed) and their
/// legend at `legend`.
pub(super) fn draw_lines<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    lines: &[Line],
    legend: SeriesLabelPosition,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    for line in lines {
        let style = line.color.stroke_width(2);
        if line.measured {
            chart
                .draw_series(LineSeries::new(line.points.iter().copied(), style))
                .map_err(|e| err(&e))?
                .label(line.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
            let dot = line.color.filled();
            chart
                .draw_series(line.points.iter().map(|&p| Circle::new(p, 3, dot)))
                .map_err(|e| err(&e))?;
        } else {
            chart
                .draw_series(DashedLineSeries::new(
                    line.points.iter().copied(),
                    8,
                    5,
                    style,
                ))
                .map_err(|e| err(&e))?
                .label(line.label.clone())
                .legend(move |(x, y)| {
                    DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, 3, style)
                });
        }
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// The lines of `busbw.svg`: the measured backends at [`BUSBW_RANKS`], then the modelled
/// ring and tree on [`BUSBW_TOPOLOGIES`].
pub(super) fn busbw_lines(measured: &Measured, modelled: &Modelled) -> Vec<Line> {
    let rows = measured.all_reduce();
    let mut lines = vec![];
    for b in measured.backends() {
        for n in BUSBW_RANKS {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.backend == b && r.ranks == n && r.busbw_gbs > 0.0)
                .map(|r| (r.bytes as f64, r.busbw_gbs))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !points.is_empty() {
                lines.push(Line {
                    label: format!("measured: {b}, {n} ranks (CPU)"),
                    points,
                    measured: true,
                    color: color(lines.len()),
                });
            }
        }
    }
    for name in BUSBW_TOPOLOGIES {
        let Some(t) = modelled.find(name) else {
            continue;
        };
        for s in &t.sweeps {
            lines.push(Line {
                label: format!(
                    "modelled: {name}, {}, {} ranks",
                    s.algorithm.name(),
                    s.ranks
                ),
                points: s
                    .points
                    .iter()
                    .filter(|p| p.1 > 0.0)
                    .map(|&(b, g)| (b as f64, g))
                    .collect(),
                measured: false,
                color: color(lines.len()),
            });
        }
    }
    lines
}

/// A log axis that holds every positive `values`, widened to whole decades.
pub(super) fn decades(values: impl Iterator<Item = f64>, fallback: (f64, f64)) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return fallback;
    }
    (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
    )
}

/// `from`, `from x step`, ... up to `to`: the tick marks of a log axis.
pub(super) fn powers(from: f64, to: f64, step: f64) -> Vec<f64> {
    std::iter::successors(Some(from), |&x| Some(x * step))
        .take_while(|&x| x <= to * (1.0 + 1e-9))
        .collect()
}

/// `busbw.svg`: all-reduce bus bandwidth against message size, log-log.
pub(super) fn busbw_svg(measured: &Measured, modelled: &Modelled) -> Result<String, String> {
    let lines = busbw_lines(measured, modelled);
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let x = (
        predict::SWEEP_MIN_BYTES as f64,
        predict::SWEEP_MAX_BYTES as f64,
    );
    let y = decades(
        lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)),
        (0.01, 1000.0),
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 650)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "all_reduce bus bandwidth: measured here (solid) and modelled (dashed)",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(
                (x.0..x.1)
                    .log_scale()
                    .with_key_points(powers(x.0, x.1, 4.0)),
                (y.0..y.1).log_scale(),
            )
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("message size")
            .y_desc("busbw (GB/s)")
            .x_label_formatter(&|b| size_label(b.round() as usize))
            .y_label_formatter(&|g| format!("{g}"))
            .draw()
            .map_err(|e| err(&e))?;
        draw_lines(&mut chart, &lines, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// The lines of `efficiency.svg`: one modelled ring line per topology, then the measured
/// line of each collective (one replica, no collective, starts them all).
pub(super) fn efficiency_lines(measured: &Measured, modelled: &Modelled) -> Vec<Line> {
    let mut lines = vec![];
    for t in &modelled.topologies {
        lines.push(Line {
            label: format!("modelled: {} (ring, {MODEL})", t.topology.name()),
            points: t
                .prediction
                .rows
                .iter()
                .filter(|r| r.algorithm == Algorithm::Ring)
                .map(|r| (r.replicas as f64, r.efficiency))
                .collect(),
            measured: false,
            color: color(lines.len()),
        });
    }
    let rows = measured.training_rows();
    let point = |r: &Value| Some((r["replicas"].as_f64()?, r["efficiency"].as_f64()?));
    let single: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r["replicas"] == 1)
        .filter_map(point)
        .collect();
    let mut collectives: Vec<&str> = vec![];
    for r in rows {
        if let Some(c) = r["collective"].as_str().filter(|c| *c != "none") {
            if !collectives.contains(&c) {
                collectives.push(c);
            }
        }
    }
    for c in collectives {
        let mut points = single.clone();
        points.extend(
            rows.iter()
                .filter(|r| r["collective"] == c && r["replicas"] != 1)
                .filter_map(point),
        );
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        lines.push(Line {
            label: format!("measured: {c} (CPU replicas, MNIST MLP)"),
            points,
            measured: true,
            color: color(lines.len()),
        });
    }
    lines
}

/// `efficiency.svg`: scaling efficiency against replicas (log 2).
pub(super) fn efficiency_svg(measured: &Measured, modelled: &Modelled) -> Result<String, String> {
    let lines = efficiency_lines(measured, modelled);
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let widest = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(2.0f64, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 650)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "scaling efficiency: measured here (solid) and modelled (dashed)",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(
                (1.0..widest)
                    .log_scale()
                    .with_key_points(powers(1.0, widest, 2.0)),
                0.0..1.05,
            )
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("replicas")
            .y_desc("efficiency = samples/s(N) / (N x samples/s(1))")
            .x_label_formatter(&|n| format!("{n:.0}"))
            .y_label_formatter(&|e| format!("{e:.1}"))
            .draw()
            .map_err(|e| err(&e))?;
        draw_lines(&mut chart, &lines, SeriesLabelPosition::LowerLeft)?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
