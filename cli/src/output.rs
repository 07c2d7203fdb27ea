//! Output a person reads fast: aligned tables, `+`/`-` diff lines, colour only on a terminal;
//! or JSON with `--output json`.

use std::io::IsTerminal;

/// `println!` that ignores a closed stdout (`dnsplan status | head`) instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` that ignores a closed stdout.
#[macro_export]
macro_rules! out_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    /// Only `plans show`: the plan file `plans publish` reads.
    Toml,
}

/// Columns padded to their widest cell; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Green for `+`, red for `-`, when stdout is a terminal and NO_COLOR is unset.
pub fn diff_line(sign: char, text: &str) -> String {
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    match (colour, sign) {
        (true, '+') => format!("\x1b[32m+ {text}\x1b[0m"),
        (true, '-') => format!("\x1b[31m- {text}\x1b[0m"),
        _ => format!("{sign} {text}"),
    }
}

pub fn ago(unix_ms: u64) -> String {
    let now = dnsplan_common::store::lease::now_unix_ms();
    let secs = now.saturating_sub(unix_ms) / 1_000;
    match secs {
        0..=119 => format!("{secs}s ago"),
        120..=7_199 => format!("{}m ago", secs / 60),
        _ => format!("{}h ago", secs / 3_600),
    }
}

/// How long until `unix_ms`: `in 4m 10s`, `in 45s`, `in 2h 5m`; `now` once it has passed
/// (the planner looks again at its next decision).
pub fn until(unix_ms: u64) -> String {
    let now = dnsplan_common::store::lease::now_unix_ms();
    let secs = unix_ms.saturating_sub(now).div_ceil(1_000);
    match secs {
        0 => "now".to_owned(),
        1..=59 => format!("in {secs}s"),
        60..=3_599 => format!("in {}m {}s", secs / 60, secs % 60),
        _ => format!("in {}h {}m", secs / 3_600, secs % 3_600 / 60),
    }
}
