//! `dnsplan zone list|add|remove`: the static zones an authority serves beside the managed
//! one (`GET`, `PUT` and `DELETE /v1/zones`), and with `--managed` the zones the store manages
//! beside its first one (`PUT` and `DELETE /v1/managed/{zone}`). `zone key new` and `zone ds`
//! ask no control API: `crate::zone_key`.

use super::{CliError, CliResult, Client, ZoneCommand};
use crate::output::{Format, table};
use dnsplan_common::status::{ZoneInfo, ZoneList};
use dnsplan_common::store::wire::ErrorBody;
use dnsplan_common::store::zones::ManagedZones;
use std::process::ExitCode;

pub(super) async fn zone(client: &Client, command: ZoneCommand) -> CliResult<ExitCode> {
    match command {
        ZoneCommand::Export => super::endpoints::zone_export(client).await,
        ZoneCommand::List => {
            let list: ZoneList = client
                .get_json("/v1/zones")
                .await?
                .ok_or_else(|| CliError::Refused("this control API serves no zones (an older authority?)".into()))?;
            if client.format == Format::Json {
                return client.print_json(&list).map(|()| ExitCode::SUCCESS);
            }
            // The managed zone's serial and names are in `dnsplan status`.
            let mut rows = vec![vec![list.managed.clone(), "-".into(), "-".into(), "managed".into(), "-".into()]];
            rows.extend(
                list.zones
                    .iter()
                    .map(|z| vec![z.origin.clone(), z.serial.to_string(), z.names.to_string(), z.source.clone(), z.queries.to_string()]),
            );
            crate::out_raw!("{}", table(&["ZONE", "SERIAL", "NAMES", "SOURCE", "QUERIES"], &rows));
            Ok(ExitCode::SUCCESS)
        }
        ZoneCommand::Add { file, origin, managed } => {
            let text = std::fs::read_to_string(&file).map_err(|e| CliError::Failed(format!("cannot read {}: {e}", file.display())))?;
            let origin = match origin {
                Some(origin) => origin,
                None => leading_origin(&text).ok_or_else(|| {
                    CliError::Failed(format!(
                        "{} does not start with $ORIGIN: name the zone with --origin (e.g. --origin example.org.)",
                        file.display()
                    ))
                })?,
            };
            if managed {
                let name = dnsplan_common::DnsName::parse(&origin).map_err(|e| CliError::Failed(format!("zone {origin:?}: {e}")))?;
                let added = client.store.add_zone(&name, &text).await?;
                crate::out!(
                    "zone {name} {} the store: plans change its endpoints (dnsplan --zone {name} plans ...), every authority of the store serves it",
                    if added { "added to" } else { "was already in" }
                );
                return Ok(ExitCode::SUCCESS);
            }
            let resp = send(client, client.http.put(url(client, &origin)).body(text)).await?;
            let info: ZoneInfo = resp.json().await.map_err(|e| CliError::Failed(format!("the answer does not read: {e}")))?;
            if client.format == Format::Json {
                return client.print_json(&info).map(|()| ExitCode::SUCCESS);
            }
            crate::out!("zone {} served: serial {}, {} names", info.origin, info.serial, info.names);
            Ok(ExitCode::SUCCESS)
        }
        // Made and shown on this machine: `main` runs them (`zone_key`) before any client is
        // built, so they never come here.
        ZoneCommand::Key { .. } | ZoneCommand::Ds { .. } => {
            Err(CliError::Failed("`zone key ...` and `zone ds` run on this machine, without a control API".into()))
        }
        ZoneCommand::Remove { name, managed } => {
            if managed {
                let origin = dnsplan_common::DnsName::parse(&name).map_err(|e| CliError::Failed(format!("zone {name:?}: {e}")))?;
                if !client.store.remove_zone(&origin).await? {
                    return Err(CliError::Refused(format!("zone {origin} is not a live zone of the store (`dnsplan zone list`)")));
                }
                crate::out!("zone {origin} removed from the store: no longer served, and its late writes are refused");
                return Ok(ExitCode::SUCCESS);
            }
            send(client, client.http.delete(url(client, &name))).await?;
            crate::out!("zone {name} no longer served");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn url(client: &Client, origin: &str) -> String {
    format!("{}/v1/zones/{origin}", client.control)
}

/// Sends a write with the token; an answer other than success is the server's message.
async fn send(client: &Client, req: reqwest::RequestBuilder) -> CliResult<reqwest::Response> {
    let resp = req.send().await.map_err(|e| CliError::Unreachable(format!("cannot reach {}: {e}", client.control)))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let message = resp.json::<ErrorBody>().await.map(|b| b.message).unwrap_or_else(|_| status.to_string());
    Err(match status.as_u16() {
        401 => CliError::Unauthorized("the stack refused the token; pass --token or set DNSPLAN_TOKEN".into()),
        403 => CliError::Unauthorized(message),
        _ => CliError::Refused(message),
    })
}

/// The name after a `$ORIGIN` on the file's first line that is not blank or a comment.
fn leading_origin(text: &str) -> Option<String> {
    let line = text.lines().map(|l| l.split(';').next().unwrap_or("").trim()).find(|l| !l.is_empty())?;
    let mut words = line.split_whitespace();
    words.next().filter(|w| w.eq_ignore_ascii_case("$ORIGIN"))?;
    words.next().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::leading_origin;

    #[test]
    fn the_origin_is_the_leading_origin_directive() {
        assert_eq!(leading_origin("; a zone\n\n$ORIGIN example.org. ; here\n@ SOA ...").as_deref(), Some("example.org."));
        assert_eq!(leading_origin("@ SOA ns hostmaster 1 2 3 4 5\n$ORIGIN example.org.\n"), None);
    }
}
