//! `dnsplan credential`: tokens for the control API's roles, made and hashed on this machine.

use crate::args::CredentialCommand;
use crate::output::Format;
use dnsplan_authority::control::access::{self, Role};

/// Runs `command`, printing on stdout; the error says what was wrong.
pub fn run(command: CredentialCommand, format: Format) -> Result<(), String> {
    match command {
        CredentialCommand::New { name, roles } => {
            let token = access::new_token()?;
            let text = new_text(&name, &roles, &token, format)?;
            crate::out_raw!("{text}");
            Ok(())
        }
        CredentialCommand::Hash => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| format!("cannot read the token from standard input: {e}"))?;
            let token = line.trim_end_matches(['\n', '\r']);
            if token.len() < access::TOKEN_BYTES_MIN {
                return Err(format!(
                    "the token is {} bytes; a credential's token needs at least {} (`dnsplan credential new` makes one)",
                    token.len(),
                    access::TOKEN_BYTES_MIN
                ));
            }
            crate::out!("{}", access::token_sha256(token));
            Ok(())
        }
    }
}

/// What `credential new` prints: the token once, and the table for authority.toml.
fn new_text(name: &str, roles: &[Role], token: &str, format: Format) -> Result<String, String> {
    let mut roles = roles.to_vec();
    roles.sort();
    roles.dedup();
    let sha256 = access::token_sha256(token);
    let table = access::CredentialConfig { name: name.to_owned(), roles: roles.clone(), sha256: Some(sha256.clone()), client_cert: None };
    // The table must load as the authority loads it.
    access::Credentials::new(None, std::slice::from_ref(&table), false)?;
    let role_names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    match format {
        Format::Json => serde_json::to_string_pretty(&serde_json::json!({
            "name": name, "roles": role_names, "token": token, "sha256": sha256,
        }))
        .map(|t| t + "\n")
        .map_err(|e| e.to_string()),
        _ => {
            let roles_toml: Vec<String> = role_names.iter().map(|r| format!("\"{r}\"")).collect();
            Ok(format!(
                "token  {token}\n       (shown once: give it to {name:?} as DNSPLAN_TOKEN or --token; the config holds only its hash)\n\n\
                 [[control.credential]]\nname = {}\nroles = [{}]\nsha256 = \"{}\"\n",
                toml_string(name),
                roles_toml.join(", "),
                sha256
            ))
        }
    }
}

fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| format!("{text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_table_loads_and_holds_the_tokens_hash() {
        let text = new_text("enactor-eu1", &[Role::Enact, Role::Read, Role::Enact], "0123456789abcdef0123", Format::Text).unwrap();
        let toml_part = &text[text.find("[[control.credential]]").unwrap()..];
        #[derive(serde::Deserialize)]
        struct Control {
            credential: Vec<access::CredentialConfig>,
        }
        #[derive(serde::Deserialize)]
        struct File {
            control: Control,
        }
        let file: File = toml::from_str(toml_part).unwrap();
        let table = &file.control.credential[0];
        assert_eq!((table.name.as_str(), table.roles.as_slice()), ("enactor-eu1", &[Role::Read, Role::Enact][..]));
        assert_eq!(table.sha256, Some(access::token_sha256("0123456789abcdef0123")));
        assert!(new_text("has space", &[Role::Read], "0123456789abcdef0123", Format::Text).is_err());
    }
}
