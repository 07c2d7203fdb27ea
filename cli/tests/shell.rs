//! What `dnsplan` gives a shell and a log collector: completion scripts and man pages
//! generated from its clap definitions, and log lines with no colour codes on a pipe (or as
//! JSON lines with `--log-format json`).

use clap::CommandFactory;
use dnsplan_cli::args::Cli;
use dnsplan_tests::ports::free_port;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// How long `dnsplan up` may take to start; far more than it needs.
const WITHIN: Duration = Duration::from_secs(30);
const BUILT_IN: &str = include_str!("../../examples/dnsplan.toml");

fn dnsplan(args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(args).output()?)
}

fn stdout_of(output: &Output) -> String {
    assert!(output.status.success(), "exit {}: {}", output.status, String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every subcommand name, at every depth (`rollback`, `plans`, `diff`, ...).
fn subcommand_names(command: &clap::Command) -> Vec<String> {
    let mut names = Vec::new();
    for sub in command.get_subcommands() {
        names.push(sub.get_name().to_owned());
        names.extend(subcommand_names(sub));
    }
    names
}

/// `dnsplan completions bash|zsh|fish` prints a script that completes every subcommand; the
/// bash one is valid bash (`bash -n`). An unknown shell is refused, naming the ones there are.
#[test]
fn completions_name_every_subcommand() -> anyhow::Result<()> {
    let names = subcommand_names(&Cli::command());
    assert!(names.iter().any(|n| n == "rollback") && names.iter().any(|n| n == "completions"), "{names:?}");
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of(&dnsplan(&["completions", shell])?);
        for name in &names {
            assert!(script.contains(name.as_str()), "{shell}: the script does not mention {name}");
        }
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("dnsplan.bash");
    std::fs::write(&path, stdout_of(&dnsplan(&["completions", "bash"])?))?;
    let check = Command::new("bash").arg("-n").arg(&path).output()?;
    assert!(check.status.success(), "bash -n: {}", String::from_utf8_lossy(&check.stderr));

    let refused = dnsplan(&["completions", "tcsh"])?;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("possible values") && stderr.contains("bash"), "{stderr}");
    Ok(())
}

/// The roff page's title line: `.TH name section ...`.
fn title_of(page: &str) -> Option<(String, String)> {
    let line = page.lines().find(|l| l.starts_with(".TH "))?;
    let mut words = line.split_whitespace().skip(1);
    Some((words.next()?.to_owned(), words.next()?.to_owned()))
}

/// `dnsplan man --dir DIR` creates DIR and writes dnsplan.1 and a page per subcommand
/// (`dnsplan-rollback.1`, `dnsplan-plans-diff.1`), each a roff man page titled with its
/// file's name, with a NAME and a SYNOPSIS section, and says which files it wrote.
#[test]
fn man_writes_a_page_per_command() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let man = dir.path().join("share/man/man1");
    let said = stdout_of(&dnsplan(&["man", "--dir", man.to_str().unwrap_or_default()])?);
    let mut pages: Vec<_> = std::fs::read_dir(&man)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    pages.sort();
    for want in ["dnsplan.1", "dnsplan-rollback.1", "dnsplan-up.1", "dnsplan-completions.1", "dnsplan-man.1", "dnsplan-plans-diff.1"] {
        assert!(pages.iter().any(|p| p.file_name().is_some_and(|n| n == want)), "no {want} in {pages:?}");
    }
    // One page for the top, one for each subcommand at every depth.
    assert_eq!(pages.len(), 1 + subcommand_names(&Cli::command()).len(), "{pages:?}");
    for path in &pages {
        let page = std::fs::read_to_string(path)?;
        let first = page.lines().next().unwrap_or_default();
        assert!(first.starts_with(".ie") || first.starts_with(".TH"), "{}: does not start as roff: {first:?}", path.display());
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        assert_eq!(title_of(&page), Some((stem.to_owned(), "1".to_owned())), "{}: title", path.display());
        for section in [".SH NAME", ".SH SYNOPSIS"] {
            assert!(page.contains(section), "{}: no {section}", path.display());
        }
        assert!(said.lines().any(|l| Path::new(l) == path), "{} is not in what man said:\n{said}", path.display());
    }
    Ok(())
}

/// `dnsplan up` with stderr on a pipe (`dnsplan up 2> file`): text log lines carry no ANSI
/// colour codes, and `--log-format json` makes them JSON lines. Before colours followed the
/// stream, every text line came with escapes (`\x1b[2m2026-...`); checked once.
#[test]
fn up_logs_on_a_pipe_are_plain_text_or_json_lines() -> anyhow::Result<()> {
    use dnsplan_tests::daemon::{assert_json_lines, assert_plain_text, log_lines_until};
    let dir = tempfile::tempdir()?;
    // The built-in config with its demo backends on ports nobody else uses.
    let config = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    std::fs::write(dir.path().join("dnsplan.toml"), config)?;
    let up = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
        command.arg("up").arg("--config").arg(dir.path().join("dnsplan.toml")).arg("--data-dir").arg(dir.path().join("data")).args([
            "--dns",
            "127.0.0.1:0",
            "--listen-control",
            "127.0.0.1:0",
        ]);
        command
    };
    assert_plain_text(&log_lines_until(&mut up(), "planner running", WITHIN)?);
    assert_json_lines(&log_lines_until(up().args(["--log-format", "json"]), "planner running", WITHIN)?);
    Ok(())
}

/// `dnsplan demo-backend` (the compose stack's backends) logs like every daemon: plain text on
/// a pipe, JSON lines with `--log-format json`.
#[test]
fn demo_backend_logs_are_plain_text_or_json_lines() -> anyhow::Result<()> {
    use dnsplan_tests::daemon::{assert_json_lines, assert_plain_text, log_lines_until};
    let backend = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
        command.args(["demo-backend", "--tcp", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
        command
    };
    assert_plain_text(&log_lines_until(&mut backend(), "demo backend listening", WITHIN)?);
    assert_json_lines(&log_lines_until(backend().args(["--log-format", "json"]), "demo backend listening", WITHIN)?);
    Ok(())
}
