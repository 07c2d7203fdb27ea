//! Certificates for the TLS tests, made with the `openssl` CLI (Debian's openssl): a CA, and
//! leaves it signs for servers and clients. A missing `openssl` fails with what to install.

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run `openssl` ({e}); install Debian's openssl, which makes the test certificates"))?;
    anyhow::ensure!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// A CA (`{ca}.crt`, `{ca}.key`).
pub fn make_ca(dir: &Path, ca: &str) -> anyhow::Result<()> {
    let (key, crt, subject) = (format!("{ca}.key"), format!("{ca}.crt"), format!("/CN=dnsplan test {ca}"));
    openssl(dir, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &key])?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )
}

/// `{leaf}.crt` and `{leaf}.key` signed by `ca`, with the subject alternative names `san`
/// (`IP:127.0.0.1`, `DNS:enactor-1.dnsplan.test`), usable by servers and clients.
pub fn make_leaf(dir: &Path, ca: &str, leaf: &str, san: &str) -> anyhow::Result<()> {
    let (key, csr, crt, ext) = (format!("{leaf}.key"), format!("{leaf}.csr"), format!("{leaf}.crt"), format!("{leaf}.ext"));
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"))?;
    // PKCS#8, which both etcd and rustls read.
    openssl(dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &key])?;
    openssl(dir, &["req", "-new", "-key", &key, "-out", &csr, "-subj", &format!("/CN={leaf}")])?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    )
}
