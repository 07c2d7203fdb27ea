//! `dnsplan`: run the whole stack in one process (`dnsplan up`), and operate a running stack
//! through its control API (`status`, `plans`, `rollback`, `pause`, `resume`, `verify`,
//! `cleanup`, `zone export`, `backend`); make control API credentials (`credential new`) and
//! a zone's DNSSEC key (`zone key new`, `zone ds`, without a control API); print
//! its shell completions (`completions SHELL`) and
//! write its man pages (`man --dir DIR`).
//!
//! Exit codes: 0 ok; 1 a check failed (`verify` mismatch, `rollback` not served in time);
//! 2 bad usage; 3 the control API is unreachable; 4 missing or wrong token; 5 the store refused
//! (conflict, paused, not found, invalid); 6 the control API answered but its store (etcd) is
//! unavailable.

use clap::Parser;
use dnsplan_cli::args::{Cli, Command};
use dnsplan_cli::{commands, demo, up};
use dnsplan_common::daemon;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Up { config, data_dir, dns, listen_control, accept_store_loss, log } => {
                daemon::init(log.log_format);
                // Before any socket or file is opened: connections come out of this limit.
                dnsplan_common::open_files::raise_to_hard();
                let shutdown = daemon::shutdown_signal();
                let overrides = up::Overrides { data_dir, dns, control: listen_control, accept_store_loss };
                match up(config, overrides, shutdown).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(err) => {
                        eprintln!("error: {err:#}");
                        ExitCode::from(1)
                    }
                }
            }
            Command::DemoBackend { http, tcp, log } => {
                daemon::init(log.log_format);
                let shutdown = daemon::shutdown_signal();
                match demo::serve_standalone(&http, &tcp).await {
                    Ok(()) => {
                        shutdown.await;
                        ExitCode::SUCCESS
                    }
                    Err(err) => {
                        eprintln!("error: {err:#}");
                        ExitCode::from(1)
                    }
                }
            }
            Command::Completions { shell } => {
                use std::io::Write;
                match std::io::stdout().write_all(&dnsplan_cli::args::completion_script(shell)) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(err) => {
                        eprintln!("error: cannot write the completion script: {err}");
                        ExitCode::from(1)
                    }
                }
            }
            Command::Man { dir } => match dnsplan_cli::args::write_man_pages(&dir) {
                Ok(written) => {
                    for path in written {
                        daemon::announce(&path.display().to_string());
                    }
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("error: cannot write man pages into {}: {err}", dir.display());
                    ExitCode::from(1)
                }
            },
            Command::Credential { command } => match dnsplan_cli::credential::run(command, cli.output) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::from(2)
                }
            },
            Command::Key { command } => match dnsplan_cli::credential::run_key(command, cli.output) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::from(2)
                }
            },
            // A zone's DNSSEC key is made and shown on this machine: no control API, token or
            // --zone is needed.
            Command::Ops(commands::Command::Zone {
                command: command @ (commands::ZoneCommand::Key { .. } | commands::ZoneCommand::Ds { .. }),
            }) => match dnsplan_cli::zone_key::run(command, cli.output).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err:#}");
                    ExitCode::from(2)
                }
            },
            Command::Ops(command) => {
                let token = match (cli.token, &cli.stack_config) {
                    (Some(t), _) => Some(t),
                    (None, Some(path)) => match up::token_of(path) {
                        Ok(t) => t,
                        Err(err) => {
                            eprintln!("error: {err:#}");
                            return ExitCode::from(2);
                        }
                    },
                    (None, None) => None,
                };
                let tls = match commands::TlsFiles::read(cli.ca_file.as_deref(), cli.cert_file.as_deref(), cli.key_file.as_deref()) {
                    Ok(tls) => tls,
                    Err(err) => return err.exit(),
                };
                let signing_key = match cli.signing_key.as_deref().map(dnsplan_common::signing::SigningKey::load).transpose() {
                    // With `dnsplan up`'s demo token, its demo key: the demo stack trusts it.
                    Ok(None) if token.as_deref().is_some_and(daemon::is_placeholder_token) => {
                        Some(dnsplan_common::signing::SigningKey::demo())
                    }
                    Ok(key) => key,
                    Err(err) => {
                        eprintln!("error: {err}");
                        return ExitCode::from(2);
                    }
                };
                let client = match commands::Client::new(&cli.control, token, tls.as_ref(), cli.output) {
                    Ok(c) => c.with_signing_key(signing_key),
                    Err(err) => return err.exit(),
                };
                let client = match &cli.zone {
                    Some(zone) => match client.for_zone(zone).await {
                        Ok(c) => c,
                        Err(err) => return err.exit(),
                    },
                    None => client,
                };
                match commands::run(&client, command).await {
                    Ok(code) => code,
                    Err(err) => err.exit(),
                }
            }
        }
    })
}

async fn up(
    config: Option<PathBuf>,
    overrides: up::Overrides,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stack = up::Stack::load(config.as_deref(), overrides)?;
    stack
        .run(shutdown, |ready| {
            let control = ready.control_url.clone();
            daemon::announce(&format!("dnsplan up: DNS zone {} on {} (UDP, TCP)", ready.zone, ready.dns));
            daemon::announce(&format!("control  {control}  (metrics at {control}/metrics)"));
            daemon::announce(&format!("store    {}", ready.data_dir.display()));
            daemon::announce(&format!("demo     {} backends (dnsplan backend fail|heal ADDRESS)", ready.demo_backends));
            daemon::announce(&format!("try      dig @{} -p {} {} A", ready.dns.ip(), ready.dns.port(), ready.first_endpoint));
            daemon::announce(&format!("         dnsplan --control {control} status"));
            daemon::announce("stop with Ctrl-C");
        })
        .await
}
