//! No Docker engine runs in CI, so `docker-compose.yml` and the `Dockerfile` are checked here
//! as well as they can be without one: the compose file's shape, every service's command
//! against the real flags of our binaries (their clap parsers), every config it mounts
//! loaded by the real config loaders, and the addresses and ports between services agreeing.

use clap::Parser;
use dnsplan_authority::config::AuthorityConfig;
use dnsplan_enactor::EnactorConfig;
use dnsplan_planner::PlannerConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A service's mapping with `<<` merge keys resolved.
fn merged(value: &Yaml) -> BTreeMap<String, Yaml> {
    let mut out = BTreeMap::new();
    if let Yaml::Hash(hash) = value {
        if let Some(base) = hash.get(&Yaml::String("<<".into())) {
            out.extend(merged(base));
        }
        for (k, v) in hash {
            if let Some(k) = k.as_str()
                && k != "<<"
            {
                out.insert(k.to_owned(), v.clone());
            }
        }
    }
    out
}

fn strings(value: &Yaml) -> Vec<String> {
    value.as_vec().map(|v| v.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

fn ipv4_of(service: &BTreeMap<String, Yaml>) -> Option<Ipv4Addr> {
    service.get("networks")?["dnsplan"]["ipv4_address"].as_str()?.parse().ok()
}

/// `/etc/dnsplan/x.toml` inside the image is `deploy/compose/x.toml` here.
fn config_path(args: &[String]) -> PathBuf {
    let i = args.iter().position(|a| a == "--config").expect("every daemon gets --config");
    let inside = &args[i + 1];
    let name = inside.strip_prefix("/etc/dnsplan/").unwrap_or_else(|| panic!("{inside} is not under /etc/dnsplan, which the image fills"));
    root().join("deploy/compose").join(name)
}

#[test]
fn compose_and_dockerfile_match_the_binaries() -> anyhow::Result<()> {
    let text = std::fs::read_to_string(root().join("docker-compose.yml"))?;
    let docs = YamlLoader::load_from_str(&text)?;
    let doc = &docs[0];
    let top = merged(doc);
    for key in top.keys() {
        assert!(
            ["name", "services", "networks", "volumes"].contains(&key.as_str()) || key.starts_with("x-"),
            "unknown top-level key {key}"
        );
    }
    let services: BTreeMap<String, BTreeMap<String, Yaml>> = match &doc["services"] {
        Yaml::Hash(h) => h.iter().map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), merged(v))).collect(),
        _ => anyhow::bail!("no services"),
    };
    let allowed = ["build", "image", "restart", "environment", "command", "volumes", "ports", "networks", "healthcheck", "depends_on"];
    let subnet = doc["networks"]["dnsplan"]["ipam"]["config"][0]["subnet"].as_str().unwrap_or_default();
    assert_eq!(subnet, "172.28.0.0/24");
    let volumes: BTreeSet<String> = match &doc["volumes"] {
        Yaml::Hash(h) => h.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect(),
        _ => BTreeSet::new(),
    };

    let mut authority = None;
    let mut planners = Vec::new();
    let mut enactors = Vec::new();
    let mut backends = BTreeMap::new();
    for (name, service) in &services {
        for key in service.keys() {
            assert!(allowed.contains(&key.as_str()), "{name}: unknown service key {key}");
        }
        assert_eq!(service.get("image").and_then(|i| i.as_str()), Some("dnsplan:local"), "{name}: image");
        assert!(service.get("environment").is_some_and(|e| !e["DNSPLAN_TOKEN"].is_badvalue()), "{name}: the shared token");
        if let Some(Yaml::Hash(deps)) = service.get("depends_on") {
            for dep in deps.keys() {
                assert!(services.contains_key(dep.as_str().unwrap_or_default()), "{name} depends on a missing service {dep:?}");
            }
        }
        for volume in strings(service.get("volumes").unwrap_or(&Yaml::Null)) {
            let source = volume.split(':').next().unwrap_or_default();
            assert!(volumes.contains(source), "{name}: volume {source} is not declared");
        }
        let ip = ipv4_of(service);
        if let Some(ip) = ip {
            assert_eq!(ip.octets()[..3], [172, 28, 0], "{name}: {ip} is outside the subnet");
        }
        let health = strings(&service.get("healthcheck").cloned().unwrap_or(Yaml::Null)["test"]);
        assert!(health.len() >= 3 && health[0] == "CMD" && health[1] == "curl", "{name}: healthcheck {health:?}");
        let health_port: u16 =
            health.last().and_then(|u| u.split(':').nth(2)).and_then(|p| p.split('/').next()).and_then(|p| p.parse().ok()).unwrap_or(0);

        let command = strings(service.get("command").unwrap_or(&Yaml::Null));
        let binary = command.first().map(String::as_str).unwrap_or_default();
        match binary {
            "dnsplan-authority" => {
                let args = dnsplan_authority::args::Args::try_parse_from(&command)?;
                let path = config_path(&command);
                assert_eq!(args.config, PathBuf::from("/etc/dnsplan/authority.toml"));
                // The token comes from the environment at run time; give it one to load here.
                let mut config: AuthorityConfig = toml::from_str(&std::fs::read_to_string(&path)?)?;
                config.control.token = Some("compose-check-token-0123456789".into());
                config.check().map_err(anyhow::Error::msg)?;
                assert_eq!(health_port, config.control.listen.port(), "authority healthcheck port");
                let ports = strings(service.get("ports").unwrap_or(&Yaml::Null));
                for addr in &config.dns.listen {
                    for proto in ["udp", "tcp"] {
                        assert!(
                            ports.iter().any(|p| p.ends_with(&format!(":{}/{proto}", addr.port()))),
                            "DNS {proto} port {} not published",
                            addr.port()
                        );
                    }
                }
                assert!(ports.iter().any(|p| p.ends_with(&format!(":{}/tcp", config.control.listen.port()))), "control port not published");
                authority = Some((name.clone(), ip.expect("the authority needs a fixed address"), config));
            }
            "dnsplan-planner" => {
                let args = dnsplan_planner::args::Args::try_parse_from(&command)?;
                let mut config = PlannerConfig::load(&config_path(&command))?;
                if let Some(id) = args.id {
                    config.id = id;
                }
                assert_eq!(health_port, config.metrics.listen.port(), "planner healthcheck port");
                planners.push(config);
            }
            "dnsplan-enactor" => {
                let args = dnsplan_enactor::args::Args::try_parse_from(&command)?;
                let config = EnactorConfig::load(&config_path(&command), args.id, args.zone)?;
                assert_eq!(health_port, config.metrics.listen.port(), "enactor healthcheck port");
                enactors.push(config);
            }
            "dnsplan" => {
                let cli = dnsplan_cli::args::Cli::try_parse_from(&command)?;
                let dnsplan_cli::args::Command::DemoBackend { http, tcp } = cli.command else {
                    anyhow::bail!("{name}: only demo-backend runs as a service");
                };
                assert!(http.iter().any(|a| a.port() == health_port), "{name}: healthcheck port {health_port} is not an HTTP listener");
                backends.insert(IpAddr::V4(ip.expect("backends need fixed addresses")), (http, tcp));
            }
            other => anyhow::bail!("{name}: {other:?} is not one of our binaries"),
        }
    }

    let (authority_name, authority_ip, authority) = authority.ok_or_else(|| anyhow::anyhow!("no authority service"))?;
    let store_url = format!("http://{authority_name}:{}", authority.control.listen.port());
    assert_eq!(planners.len(), 1, "one planner");
    assert_eq!(enactors.len(), 3, "three enactors");
    let zones: BTreeSet<String> = enactors.iter().map(|e| e.zone.to_string()).collect();
    assert_eq!(zones, ["a", "b", "c"].iter().map(|z| z.to_string()).collect());
    let ids: BTreeSet<&str> = enactors.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 3, "enactor ids must differ");
    for e in &enactors {
        assert_eq!(e.store.url, store_url, "{}: store.url", e.id);
        assert!(e.verify.enabled);
        assert_eq!(e.verify.dns_server.ip(), IpAddr::V4(authority_ip), "{}: verify.dns_server is the authority", e.id);
        assert!(authority.dns.listen.iter().any(|a| a.port() == e.verify.dns_server.port()), "{}: verify port", e.id);
    }
    let planner = &planners[0];
    assert_eq!(planner.store.url, store_url);
    assert_eq!(planner.dns_zone.to_string(), authority.dns_zone.origin);
    for ep in planner.endpoints() {
        for t in &ep.targets {
            let (http, tcp) = backends.get(&t.address).unwrap_or_else(|| panic!("{}: target {} is no backend service", ep.name, t.address));
            let port = match &ep.check_for(t).expect("checks are required").probe {
                dnsplan_planner::config::Probe::Http { port, .. } => http.iter().any(|a| a.port() == *port).then_some(*port),
                dnsplan_planner::config::Probe::Tcp { port } => tcp.iter().any(|a| a.port() == *port).then_some(*port),
            };
            assert!(port.is_some(), "{}: the check of {} has no listener on its backend", ep.name, t.address);
        }
    }

    let dockerfile = std::fs::read_to_string(root().join("Dockerfile"))?;
    for binary in ["dnsplan-authority", "dnsplan-planner", "dnsplan-enactor", "target/release/dnsplan "] {
        assert!(dockerfile.contains(binary), "the Dockerfile does not build {binary}");
    }
    for needed in ["--locked", "curl", "COPY deploy/compose/ /etc/dnsplan/", "USER dnsplan"] {
        assert!(dockerfile.contains(needed), "the Dockerfile lacks {needed:?}");
    }
    Ok(())
}
