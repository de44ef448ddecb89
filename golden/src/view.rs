//! A trace drawn as a space-time diagram: one lane per node (and one for the harness), time running left to right,
//! each transition a dot (hover for its line), replication as arrows from the first node to apply an entry to each
//! other node applying it, and faults shaded from when they hit a node until it is back.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One parsed trace line.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Simulated seconds.
    pub time: f64,
    /// The lane: `harness`, `client`, or `n<id>`.
    pub lane: String,
    /// The event's name.
    pub name: String,
    /// The whole line.
    pub line: String,
}

/// The events of a rendered trace (legend lines and anything unparsable are skipped).
pub fn parse(trace: &str) -> Vec<Event> {
    trace
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let time = words.next()?.parse().ok()?;
            let lane = words.next()?.to_string();
            let name = words.next()?.to_string();
            Some(Event { time, lane, name, line: line.trim().to_string() })
        })
        .collect()
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

fn color(name: &str) -> &'static str {
    match name {
        "crash" | "power-off" | "power-fail" | "isolate" | "partition" | "one-way" | "pause" | "disk-faults" => {
            "#d62728"
        }
        "restart" | "resume" | "heal" | "unclog" | "repaired" => "#2ca02c",
        "role" | "membership" | "add-node" | "remove-node" => "#1f77b4",
        "snapshot" | "purged" | "repairing" => "#9467bd",
        "txn-committed" | "txn-aborted" | "dead-lettered" | "expired" => "#ff7f0e",
        _ => "#7f7f7f",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Faults that take a node away until the matching recovery.
fn opens(name: &str) -> bool {
    matches!(name, "crash" | "power-off" | "pause" | "isolate")
}

fn closes(name: &str) -> bool {
    matches!(name, "restart" | "resume" | "heal")
}

/// The diagram of `trace` as a standalone HTML page.
pub fn html(title: &str, trace: &str) -> String {
    const LANE: f64 = 60.0;
    const LEFT: f64 = 80.0;
    let events = parse(trace);
    let mut lanes: Vec<String> = Vec::new();
    for event in &events {
        if !lanes.contains(&event.lane) {
            lanes.push(event.lane.clone());
        }
    }
    lanes.sort_by_key(|lane| {
        (lane != "harness", lane.trim_start_matches('n').parse::<u64>().unwrap_or(0), lane.clone())
    });
    let end = events.iter().map(|event| event.time).fold(1.0_f64, f64::max);
    let scale = (12_000.0 / end).clamp(50.0, 400.0);
    let (width, height) = (LEFT + end * scale + 40.0, LANE * (lanes.len() as f64 + 1.0));
    let x = |time: f64| LEFT + time * scale;
    let y = |lane: &str| LANE * (lanes.iter().position(|known| known == lane).unwrap_or(0) as f64 + 1.0);

    let mut svg = String::new();
    let _ = write!(svg, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}">"#);
    // Time axis: a tick every second.
    for second in 0..=(end.ceil() as u64) {
        let at = x(second as f64);
        let _ = write!(
            svg,
            r##"<line x1="{at:.1}" y1="20" x2="{at:.1}" y2="{height:.0}" stroke="#eee"/><text x="{at:.1}" y="14" font-size="10">{second}s</text>"##
        );
    }
    // Faults: shaded from when a node is hit until it is back (or the end).
    let mut open: BTreeMap<&str, f64> = BTreeMap::new();
    let shade = |svg: &mut String, lane: &str, from: f64, to: f64| {
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#d62728" opacity="0.12"/>"##,
            x(from),
            y(lane) - LANE / 3.0,
            (x(to) - x(from)).max(1.0),
            LANE / 1.5
        );
    };
    for event in &events {
        if opens(&event.name) {
            open.entry(&event.lane).or_insert(event.time);
        } else if closes(&event.name) {
            let lanes_back: Vec<&str> = if event.name == "heal" {
                open.keys().copied().filter(|lane| !lane.is_empty()).collect()
            } else {
                vec![event.lane.as_str()]
            };
            for lane in lanes_back {
                if let Some(from) = open.remove(lane) {
                    shade(&mut svg, lane, from, event.time);
                }
            }
        }
    }
    for (lane, from) in open {
        shade(&mut svg, lane, from, end);
    }
    // Lanes.
    for lane in &lanes {
        let at = y(lane);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{at:.1}" x2="{width:.0}" y2="{at:.1}" stroke="#ccc"/><text x="8" y="{:.1}" font-size="13" font-family="monospace">{}</text>"##,
            at + 4.0,
            escape(lane)
        );
    }
    // Replication: from the first node to apply an entry to every other node applying it.
    let mut first_apply: BTreeMap<&str, (f64, &str)> = BTreeMap::new();
    for event in events.iter().filter(|event| event.name == "apply") {
        let Some(index) = field(&event.line, "index") else { continue };
        match first_apply.get(index) {
            None => {
                first_apply.insert(index, (event.time, &event.lane));
            }
            Some(&(time, lane)) if lane != event.lane => {
                let _ = write!(
                    svg,
                    r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#1f77b4" stroke-width="0.6" opacity="0.5" marker-end="url(#arrow)"/>"##,
                    x(time),
                    y(lane),
                    x(event.time),
                    y(&event.lane)
                );
            }
            Some(_) => {}
        }
    }
    // Every transition, with its line on hover.
    for event in &events {
        let _ = write!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"><title>{}</title></circle>"#,
            x(event.time),
            y(&event.lane),
            color(&event.name),
            escape(&event.line)
        );
    }
    svg.push_str(
        r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="5" markerHeight="5" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#1f77b4"/></marker></defs></svg>"##,
    );
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head><body>\n<h3>{title}</h3>\n\
         <p>Lanes are nodes; time runs left to right. Red shading: a node crashed, lost power, paused or was cut off, \
         until it was back. Blue arrows: an entry applied first on one node and then on another. Hover a dot for its \
         trace line.</p>\n<div style=\"overflow-x:auto\">{svg}</div>\n</body></html>\n",
        title = escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "# legend\n    0.010 n1      role state=leader term=1 leader=1\n    0.020 n1      apply index=2 at=5 \
                         commands=tick×1 results=ticked×1\n    0.030 n2      apply index=2 at=5 commands=tick×1 \
                         results=ticked×1\n    0.040 n2      crash\n    0.050 n2      restart\n";

    #[test]
    fn lines_parse_into_time_lane_and_event() {
        let events = parse(TRACE);
        assert_eq!(events.len(), 5);
        assert_eq!((events[1].time, events[1].lane.as_str(), events[1].name.as_str()), (0.02, "n1", "apply"));
        assert_eq!(field(&events[1].line, "index"), Some("2"));
    }

    #[test]
    fn the_page_has_lanes_an_arrow_a_shaded_fault_and_every_line() {
        let page = html("run", TRACE);
        assert!(page.contains(">n1</text>") && page.contains(">n2</text>"));
        assert_eq!(page.matches("marker-end").count(), 1, "one entry replicated to one other node");
        assert_eq!(page.matches("opacity=\"0.12\"").count(), 1, "one shaded outage");
        assert_eq!(page.matches("<circle").count(), 5);
    }
}
