//! `dnsplan credential`: tokens for the control API's roles, made and hashed on this machine;
//! `dnsplan key`: plan signing keys, made and shown on this machine.

use crate::args::{CredentialCommand, KeyCommand};
use crate::output::Format;
use dnsplan_authority::control::access::{self, Role};
use dnsplan_common::signing::{Keyring, KeyringConfig, SigningKey, TrustedKeyConfig, public_key_text};
use std::io::Write;

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

/// Runs a `dnsplan key` command, printing on stdout.
pub fn run_key(command: KeyCommand, format: Format) -> Result<(), String> {
    match command {
        KeyCommand::New { name, file, zones, authors } => {
            let (key, pem) = SigningKey::generate()?;
            let table = TrustedKeyConfig { name, public_key: public_key_text(&key.public_key()), zones, authors };
            // The table must load as every daemon loads it, before a key is written for it.
            Keyring::from_config(&KeyringConfig { key: vec![table.clone()] })?;
            write_private(&file, pem.as_bytes())?;
            crate::out_raw!("{}", key_text(&table, Some(&file), format)?);
            Ok(())
        }
        KeyCommand::Public { file } => {
            let key = SigningKey::load(&file).map_err(|e| e.to_string())?;
            match format {
                Format::Json => crate::out!("{}", serde_json::json!({ "public_key": public_key_text(&key.public_key()) })),
                _ => crate::out!("{}", public_key_text(&key.public_key())),
            }
            Ok(())
        }
    }
}

/// Writes `bytes` to a new file at `path` that only its owner may read.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => format!("{} exists; a key is never written over another", path.display()),
        _ => format!("cannot create {}: {e}", path.display()),
    })?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// What `key new` prints: where the key is, and the table that trusts it.
fn key_text(table: &TrustedKeyConfig, file: Option<&std::path::Path>, format: Format) -> Result<String, String> {
    match format {
        Format::Json => serde_json::to_string_pretty(&serde_json::json!({
            "name": table.name, "public_key": table.public_key, "zones": table.zones, "authors": table.authors,
            "file": file.map(|f| f.display().to_string()),
        }))
        .map(|t| t + "\n")
        .map_err(|e| e.to_string()),
        _ => {
            let list = |items: &[String]| items.iter().map(|i| toml_string(i)).collect::<Vec<_>>().join(", ");
            let file = file.map(|f| {
                format!("private key  {} (mode 0600: the planner's signing.key_file, or the CLI's --signing-key)\n\n", f.display())
            });
            Ok(format!(
                "{}[[keyring.key]]\nname = {}\npublic_key = \"{}\"\nzones = [{}]\nauthors = [{}]\n",
                file.unwrap_or_default(),
                toml_string(&table.name),
                table.public_key,
                list(&table.zones),
                list(&table.authors)
            ))
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
    fn a_new_key_is_private_its_table_trusts_it_and_no_file_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("alice.key");
        let new = || KeyCommand::New {
            name: "alice".into(),
            file: file.clone(),
            zones: vec!["example.test".into()],
            authors: vec!["operator:alice".into()],
        };
        run_key(new(), Format::Text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let key = SigningKey::load(&file).unwrap();
        let before = std::fs::read(&file).unwrap();
        let err = run_key(new(), Format::Text).unwrap_err();
        assert!(err.contains("never written over"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), before);
        let table = TrustedKeyConfig {
            name: "alice".into(),
            public_key: public_key_text(&key.public_key()),
            zones: vec!["example.test".into()],
            authors: vec!["operator:alice".into()],
        };
        let text = key_text(&table, None, Format::Text).unwrap();
        let parsed: KeyringFile = toml::from_str(&text).unwrap();
        assert_eq!(parsed.keyring.key, vec![table]);
    }

    #[derive(serde::Deserialize)]
    struct KeyringFile {
        keyring: KeyringConfig,
    }

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
