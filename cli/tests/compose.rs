//! No Docker engine runs in CI, so `docker-compose.yml` and the `Dockerfile` are checked here
//! as well as they can be without one: the compose file's shape, every service's command
//! against the real flags of our binaries (their clap parsers), every config it mounts
//! loaded by the real config loaders, and the addresses and ports between services agreeing.
//! The monitoring services are held to the same: Prometheus scrapes exactly the daemons'
//! metrics listeners and loads the mounted alert rules, Grafana's provisioning points at that
//! Prometheus and loads the mounted dashboard, and every file they mount exists.

use clap::Parser;
use dnsplan_authority::config::AuthorityConfig;
use dnsplan_enactor::EnactorConfig;
use dnsplan_planner::PlannerConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
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
    // `service:port` of every daemon's /metrics, which Prometheus must scrape.
    let mut metrics_targets = BTreeSet::new();
    let mut monitoring = BTreeMap::new();
    for (name, service) in &services {
        for key in service.keys() {
            assert!(allowed.contains(&key.as_str()), "{name}: unknown service key {key}");
        }
        let deps = match service.get("depends_on") {
            Some(Yaml::Hash(deps)) => deps.keys().filter_map(|d| d.as_str().map(str::to_owned)).collect(),
            Some(list) => strings(list),
            None => Vec::new(),
        };
        for dep in deps {
            assert!(services.contains_key(&dep), "{name} depends on a missing service {dep:?}");
        }
        for volume in strings(service.get("volumes").unwrap_or(&Yaml::Null)) {
            let source = volume.split(':').next().unwrap_or_default();
            match source.strip_prefix("./") {
                Some(path) => assert!(root().join(path).exists(), "{name}: mounts {source}, which does not exist"),
                None => assert!(volumes.contains(source), "{name}: volume {source} is not declared"),
            }
        }
        let image = service.get("image").and_then(|i| i.as_str()).unwrap_or_default();
        if image != "dnsplan:local" {
            let (repo, tag) = image.split_once(':').unwrap_or((image, ""));
            assert!(["prom/prometheus", "grafana/grafana"].contains(&repo), "{name}: image {image} is neither ours nor a monitoring one");
            assert!(!tag.is_empty() && tag != "latest", "{name}: image {image} has no pinned version");
            for port in strings(service.get("ports").unwrap_or(&Yaml::Null)) {
                assert!(port.starts_with("127.0.0.1:"), "{name}: port {port} is published beyond loopback");
            }
            monitoring.insert(repo.to_owned(), (name.clone(), service.clone()));
            continue;
        }
        assert!(service.get("environment").is_some_and(|e| !e["DNSPLAN_TOKEN"].is_badvalue()), "{name}: the shared token");
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
                metrics_targets.insert(format!("{name}:{}", config.control.listen.port()));
                authority = Some((name.clone(), ip.expect("the authority needs a fixed address"), config));
            }
            "dnsplan-planner" => {
                let args = dnsplan_planner::args::Args::try_parse_from(&command)?;
                let mut config = PlannerConfig::load(&config_path(&command))?;
                if let Some(id) = args.id {
                    config.id = id;
                }
                assert_eq!(health_port, config.metrics.listen.port(), "planner healthcheck port");
                metrics_targets.insert(format!("{name}:{}", config.metrics.listen.port()));
                planners.push(config);
            }
            "dnsplan-enactor" => {
                let args = dnsplan_enactor::args::Args::try_parse_from(&command)?;
                let config = EnactorConfig::load(&config_path(&command), args.id, args.zone)?;
                assert_eq!(health_port, config.metrics.listen.port(), "enactor healthcheck port");
                metrics_targets.insert(format!("{name}:{}", config.metrics.listen.port()));
                enactors.push(config);
            }
            "dnsplan" => {
                let cli = dnsplan_cli::args::Cli::try_parse_from(&command)?;
                let dnsplan_cli::args::Command::DemoBackend { http, tcp, .. } = cli.command else {
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
        assert_eq!(e.store.control_url(), Some(store_url.as_str()), "{}: store.url", e.id);
        assert!(e.verify.enabled);
        assert_eq!(e.verify.dns_server.ip(), IpAddr::V4(authority_ip), "{}: verify.dns_server is the authority", e.id);
        assert!(authority.dns.listen.iter().any(|a| a.port() == e.verify.dns_server.port()), "{}: verify port", e.id);
    }
    let planner = &planners[0];
    assert_eq!(planner.store.control_url(), Some(store_url.as_str()));
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

    check_monitoring(&monitoring, &metrics_targets)?;

    let dockerfile = std::fs::read_to_string(root().join("Dockerfile"))?;
    for binary in ["dnsplan-authority", "dnsplan-planner", "dnsplan-enactor", "target/release/dnsplan "] {
        assert!(dockerfile.contains(binary), "the Dockerfile does not build {binary}");
    }
    for needed in ["--locked", "curl", "COPY deploy/compose/ /etc/dnsplan/", "USER dnsplan"] {
        assert!(dockerfile.contains(needed), "the Dockerfile lacks {needed:?}");
    }
    Ok(())
}

/// Where a service mounts `inside` from: the path in the repository of a `./` bind mount.
fn mounted_from(service: &BTreeMap<String, Yaml>, inside: &str) -> Option<PathBuf> {
    strings(service.get("volumes").unwrap_or(&Yaml::Null)).iter().find_map(|v| {
        let mut parts = v.split(':');
        let (source, target) = (parts.next()?, parts.next()?);
        let source = source.strip_prefix("./")?;
        (target == inside).then(|| root().join(source))
    })
}

/// The file behind `inside`, mounted itself or inside a mounted directory.
fn file_behind(service: &BTreeMap<String, Yaml>, inside: &str) -> Option<PathBuf> {
    let mut dir = Path::new(inside);
    let mut rest = PathBuf::new();
    loop {
        if let Some(source) = mounted_from(service, dir.to_str()?) {
            return Some(if rest.as_os_str().is_empty() { source } else { source.join(&rest) });
        }
        rest = Path::new(dir.file_name()?).join(rest);
        dir = dir.parent()?;
    }
}

fn load_yaml(path: &Path) -> anyhow::Result<Yaml> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(YamlLoader::load_from_str(&text)?.into_iter().next().unwrap_or(Yaml::Null))
}

/// Prometheus scrapes every daemon and nothing else, with the repository's alert rules;
/// Grafana reads that Prometheus and loads the dashboard.
fn check_monitoring(
    monitoring: &BTreeMap<String, (String, BTreeMap<String, Yaml>)>,
    metrics_targets: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let (prometheus_name, prometheus) = monitoring.get("prom/prometheus").ok_or_else(|| anyhow::anyhow!("no Prometheus service"))?;
    let command = strings(prometheus.get("command").unwrap_or(&Yaml::Null));
    let config_inside = command
        .iter()
        .find_map(|a| a.strip_prefix("--config.file="))
        .ok_or_else(|| anyhow::anyhow!("{prometheus_name}: command {command:?} names no --config.file"))?;
    let config_path = file_behind(prometheus, config_inside).ok_or_else(|| anyhow::anyhow!("{config_inside} is not mounted"))?;
    assert_eq!(config_path, root().join("deploy/prometheus/prometheus.yml"));
    let config = load_yaml(&config_path)?;
    let config_dir = Path::new(config_inside).parent().unwrap_or(Path::new("/"));
    let rule_files = strings(&config["rule_files"]);
    assert!(!rule_files.is_empty(), "Prometheus loads no rules");
    for rules in rule_files {
        let inside = config_dir.join(&rules);
        let source = file_behind(prometheus, inside.to_str().unwrap_or_default());
        assert_eq!(source, Some(root().join("deploy/prometheus/alerts.yml")), "rule file {rules} is not the repository's alerts.yml");
    }
    let mut scraped = BTreeSet::new();
    for job in config["scrape_configs"].as_vec().map(Vec::as_slice).unwrap_or_default() {
        let name = job["job_name"].as_str().unwrap_or_default();
        // alerts.yml's DnsplanTargetDown watches `up{job=~"dnsplan-.*"}`.
        assert!(name.starts_with("dnsplan-"), "scrape job {name:?} is not named dnsplan-*");
        assert!(job["metrics_path"].is_badvalue(), "{name}: the daemons serve /metrics, Prometheus's default path");
        for static_config in job["static_configs"].as_vec().map(Vec::as_slice).unwrap_or_default() {
            for target in strings(&static_config["targets"]) {
                assert!(scraped.insert(target.clone()), "{target} is scraped twice");
            }
        }
    }
    assert_eq!(&scraped, metrics_targets, "Prometheus must scrape exactly every daemon's metrics listener");
    let prometheus_port = strings(prometheus.get("ports").unwrap_or(&Yaml::Null))
        .iter()
        .find_map(|p| p.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(9090);

    let (grafana_name, grafana) = monitoring.get("grafana/grafana").ok_or_else(|| anyhow::anyhow!("no Grafana service"))?;
    let deps = strings(grafana.get("depends_on").unwrap_or(&Yaml::Null));
    assert!(deps.contains(prometheus_name), "{grafana_name} must start after {prometheus_name}");
    let provisioning =
        file_behind(grafana, "/etc/grafana/provisioning").ok_or_else(|| anyhow::anyhow!("{grafana_name}: no provisioning mounted"))?;
    let sources = load_yaml(&provisioning.join("datasources/prometheus.yml"))?;
    let source = &sources["datasources"][0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    assert_eq!(source["url"].as_str(), Some(format!("http://{prometheus_name}:{prometheus_port}").as_str()), "Grafana's data source");
    let providers = load_yaml(&provisioning.join("dashboards/dnsplan.yml"))?;
    let dashboards = providers["providers"][0]["options"]["path"].as_str().unwrap_or_default();
    let dashboard = file_behind(grafana, &format!("{dashboards}/dnsplan.json"));
    assert_eq!(dashboard, Some(root().join("deploy/grafana/dnsplan.json")), "the dashboard provider's path holds the dashboard");
    // The dashboard itself (its queries and metric names) is checked by tests/tests/monitoring.rs.
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/dnsplan.json"))?)?;
    assert_eq!(json["uid"].as_str(), Some("dnsplan"));
    Ok(())
}

/// A compose file's services by name, each with `<<` merge keys resolved.
type Services = BTreeMap<String, BTreeMap<String, Yaml>>;

/// The services of a compose file, and the document.
fn load_compose(file: &str) -> anyhow::Result<(Yaml, Services)> {
    let text = std::fs::read_to_string(root().join(file))?;
    let doc = YamlLoader::load_from_str(&text)?.into_iter().next().unwrap_or(Yaml::Null);
    let services = match &doc["services"] {
        Yaml::Hash(h) => h.iter().map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), merged(v))).collect(),
        _ => anyhow::bail!("{file}: no services"),
    };
    Ok((doc, services))
}

/// `(host port, protocol)` of every port a compose file publishes on the host.
fn host_ports(services: &Services) -> Vec<(String, u16, String)> {
    let mut out = Vec::new();
    for (name, service) in services {
        for spec in strings(service.get("ports").unwrap_or(&Yaml::Null)) {
            let (spec, proto) = spec.split_once('/').unwrap_or((&spec, "tcp"));
            let parts: Vec<&str> = spec.split(':').collect();
            assert!(parts.len() >= 2, "{name}: port {spec} publishes no fixed host port");
            let host: u16 = parts[parts.len() - 2].parse().unwrap_or_else(|_| panic!("{name}: port {spec}"));
            out.push((name.clone(), host, proto.to_owned()));
        }
    }
    out
}

/// Whom a service waits for, and whether it waits for them to be healthy.
fn depends_on(service: &BTreeMap<String, Yaml>) -> BTreeMap<String, bool> {
    match service.get("depends_on") {
        Some(Yaml::Hash(deps)) => {
            deps.iter().filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v["condition"].as_str() == Some("service_healthy")))).collect()
        }
        Some(list) => strings(list).into_iter().map(|d| (d, false)).collect(),
        None => BTreeMap::new(),
    }
}

/// The flags of the `etcd` on PATH (Debian's etcd-server), from `etcd --help`.
fn etcd_flags() -> anyhow::Result<BTreeSet<String>> {
    dnsplan_tests::etcd::check_etcd_installed()?;
    let out = std::process::Command::new("etcd").arg("--help").output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let flags: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  --"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|f| f.trim_end_matches('=').to_owned())
        .collect();
    anyhow::ensure!(flags.len() > 30 && flags.contains("initial-cluster"), "`etcd --help` lists no flags as expected:\n{text}");
    Ok(flags)
}

/// `docker-compose.etcd.yml`: three etcd members of one static cluster, their flags checked
/// against the real `etcd --help`; two authorities, the planner and three enactors, all on
/// `[store] kind = "etcd"` with those members' client URLs, their commands and configs checked
/// with our parsers and loaders; healthchecks and start order; and host ports that clash
/// neither inside the file nor with `docker-compose.yml`, so that both stacks can run at once.
#[test]
fn etcd_compose_matches_the_binaries_and_etcd() -> anyhow::Result<()> {
    let (doc, services) = load_compose("docker-compose.etcd.yml")?;
    for key in merged(&doc).keys() {
        assert!(
            ["name", "services", "networks", "volumes"].contains(&key.as_str()) || key.starts_with("x-"),
            "unknown top-level key {key}"
        );
    }
    let subnet = doc["networks"]["dnsplan"]["ipam"]["config"][0]["subnet"].as_str().unwrap_or_default();
    assert_eq!(subnet, "172.29.0.0/24", "a subnet of its own, beside docker-compose.yml's 172.28.0.0/24");
    let volumes: BTreeSet<String> = match &doc["volumes"] {
        Yaml::Hash(h) => h.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect(),
        _ => BTreeSet::new(),
    };
    let allowed = ["build", "image", "restart", "environment", "command", "volumes", "ports", "networks", "healthcheck", "depends_on"];
    let etcd_known = etcd_flags()?;

    // The cluster: each member's flags, as `--flag=value`.
    let mut members: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut named_volumes_used = BTreeSet::new();
    for (name, service) in &services {
        for key in service.keys() {
            assert!(allowed.contains(&key.as_str()), "{name}: unknown service key {key}");
        }
        for dep in depends_on(service).keys() {
            assert!(services.contains_key(dep), "{name} depends on a missing service {dep:?}");
        }
        for volume in strings(service.get("volumes").unwrap_or(&Yaml::Null)) {
            let source = volume.split(':').next().unwrap_or_default();
            assert!(volumes.contains(source), "{name}: volume {source} is not declared");
            assert!(named_volumes_used.insert(source.to_owned()), "{name}: volume {source} is shared with another service");
        }
        let image = service.get("image").and_then(|i| i.as_str()).unwrap_or_default();
        let Some(tag) = image.strip_prefix("gcr.io/etcd-development/etcd:").or_else(|| image.strip_prefix("quay.io/coreos/etcd:")) else {
            continue;
        };
        assert!(tag.starts_with("v3."), "{name}: image {image} is not a pinned etcd v3 version");
        assert!(service.get("ports").is_none(), "{name}: etcd's ports stay on the compose network");
        let command = strings(service.get("command").unwrap_or(&Yaml::Null));
        assert!(["etcd", "/usr/local/bin/etcd"].contains(&command.first().map(String::as_str).unwrap_or_default()), "{name}: {command:?}");
        let mut flags = BTreeMap::new();
        for arg in &command[1..] {
            let (flag, value) =
                arg.strip_prefix("--").and_then(|a| a.split_once('=')).unwrap_or_else(|| panic!("{name}: {arg:?} is not --flag=value"));
            assert!(etcd_known.contains(flag), "{name}: --{flag} is not a flag of etcd (see `etcd --help`)");
            assert!(flags.insert(flag.to_owned(), value.to_owned()).is_none(), "{name}: --{flag} given twice");
        }
        let health = strings(&service.get("healthcheck").cloned().unwrap_or(Yaml::Null)["test"]);
        assert_eq!(health, ["CMD", "etcdctl", "--endpoints=http://127.0.0.1:2379", "endpoint", "health"], "{name}: healthcheck");
        members.insert(name.clone(), flags);
    }
    assert_eq!(members.len(), 3, "three etcd members");
    let mut client_urls = BTreeSet::new();
    let mut clusters = BTreeSet::new();
    for (name, flags) in &members {
        let flag = |f: &str| flags.get(f).map(String::as_str).unwrap_or_else(|| panic!("{name}: no --{f}"));
        assert_eq!(flag("name"), name, "{name}: --name is the service's name (the initial cluster lists it by it)");
        assert_eq!(flag("listen-client-urls"), "http://0.0.0.0:2379", "{name}: the healthcheck's port");
        assert_eq!(flag("advertise-client-urls"), format!("http://{name}:2379"));
        assert_eq!(flag("listen-peer-urls"), "http://0.0.0.0:2380");
        assert_eq!(flag("initial-advertise-peer-urls"), format!("http://{name}:2380"));
        assert_eq!(flag("initial-cluster-state"), "new");
        assert_eq!(flag("initial-cluster-token"), "dnsplan-etcd");
        let data = flag("data-dir");
        let mounted = strings(services[name].get("volumes").unwrap_or(&Yaml::Null));
        assert!(mounted.iter().any(|v| v.split(':').nth(1) == Some(data)), "{name}: --data-dir {data} is not on a volume");
        let cluster: BTreeMap<&str, &str> = flag("initial-cluster").split(',').filter_map(|m| m.split_once('=')).collect();
        assert_eq!(cluster.get(name.as_str()).copied(), Some(flag("initial-advertise-peer-urls")), "{name}: in --initial-cluster");
        assert_eq!(cluster.keys().map(|k| k.to_string()).collect::<BTreeSet<_>>(), members.keys().cloned().collect());
        clusters.insert(flag("initial-cluster").to_owned());
        client_urls.insert(flag("advertise-client-urls").to_owned());
    }
    assert_eq!(clusters.len(), 1, "every member names the same --initial-cluster");

    // Our daemons, on that cluster.
    let mut authorities = BTreeMap::new();
    let mut planners = Vec::new();
    let mut enactors = Vec::new();
    let mut backends = BTreeMap::new();
    let mut prefixes = BTreeSet::new();
    let mut on_etcd = |who: &str, store: &dnsplan_common::store_config::StoreConfig| {
        let dnsplan_common::store_config::StoreConfig::Etcd(etcd) = store else { panic!("{who}: [store] is not kind = \"etcd\"") };
        assert_eq!(etcd.endpoints.iter().cloned().collect::<BTreeSet<_>>(), client_urls, "{who}: store.endpoints are the members");
        prefixes.insert(etcd.prefix.clone());
    };
    for (name, service) in services.iter().filter(|(name, _)| !members.contains_key(*name)) {
        let image = service.get("image").and_then(|i| i.as_str()).unwrap_or_default();
        assert_eq!(image, "dnsplan:local", "{name}: image {image} is neither ours nor etcd");
        assert!(service.get("environment").is_some_and(|e| !e["DNSPLAN_TOKEN"].is_badvalue()), "{name}: the shared token");
        let ip = ipv4_of(service);
        if let Some(ip) = ip {
            assert_eq!(ip.octets()[..3], [172, 29, 0], "{name}: {ip} is outside the subnet");
        }
        let health = strings(&service.get("healthcheck").cloned().unwrap_or(Yaml::Null)["test"]);
        assert!(health.len() >= 3 && health[0] == "CMD" && health[1] == "curl", "{name}: healthcheck {health:?}");
        let health_port: u16 =
            health.last().and_then(|u| u.split(':').nth(2)).and_then(|p| p.split('/').next()).and_then(|p| p.parse().ok()).unwrap_or(0);
        let deps = depends_on(service);
        let command = strings(service.get("command").unwrap_or(&Yaml::Null));
        match command.first().map(String::as_str).unwrap_or_default() {
            "dnsplan-authority" => {
                dnsplan_authority::args::Args::try_parse_from(&command)?;
                let mut config: AuthorityConfig = toml::from_str(&std::fs::read_to_string(config_path(&command))?)?;
                config.control.token = Some("compose-check-token-0123456789".into());
                config.check().map_err(anyhow::Error::msg)?;
                on_etcd(name, config.store.as_ref().unwrap_or_else(|| panic!("{name}: no [store]: the embedded store")));
                assert_eq!(health_port, config.control.listen.port(), "{name}: healthcheck port");
                let mounted = strings(service.get("volumes").unwrap_or(&Yaml::Null));
                let data = config.data_dir.to_str().unwrap_or_default();
                assert!(
                    mounted.iter().any(|v| v.split(':').nth(1) == Some(data)),
                    "{name}: data_dir {data} (its served-state) is not on a volume"
                );
                let ports = strings(service.get("ports").unwrap_or(&Yaml::Null));
                for addr in &config.dns.listen {
                    for proto in ["udp", "tcp"] {
                        assert!(
                            ports.iter().any(|p| p.ends_with(&format!(":{}/{proto}", addr.port()))),
                            "{name}: DNS {proto} not published"
                        );
                    }
                }
                for member in members.keys() {
                    assert_eq!(deps.get(member), Some(&true), "{name}: the first start waits for {member} to be healthy");
                }
                let ip = ip.expect("authorities need fixed addresses");
                // `dnsplan verify` asks each authority where it reports itself.
                let reachable: Vec<SocketAddr> = config.dns.listen.iter().map(|l| SocketAddr::from((ip, l.port()))).collect();
                assert_eq!(config.dns.advertise, reachable, "{name}: dns.advertise is its fixed address and DNS port");
                authorities.insert(name.clone(), (ip, config));
            }
            "dnsplan-planner" => {
                let args = dnsplan_planner::args::Args::try_parse_from(&command)?;
                let mut config = PlannerConfig::load(&config_path(&command))?;
                if let Some(id) = args.id {
                    config.id = id;
                }
                on_etcd(name, &config.store);
                assert_eq!(health_port, config.metrics.listen.port(), "{name}: healthcheck port");
                for member in members.keys() {
                    assert_eq!(deps.get(member), Some(&true), "{name} waits for {member} to be healthy");
                }
                planners.push(config);
            }
            "dnsplan-enactor" => {
                let args = dnsplan_enactor::args::Args::try_parse_from(&command)?;
                let config = EnactorConfig::load(&config_path(&command), args.id, args.zone)?;
                on_etcd(name, &config.store);
                assert_eq!(health_port, config.metrics.listen.port(), "{name}: healthcheck port");
                for member in members.keys() {
                    assert_eq!(deps.get(member), Some(&true), "{name} waits for {member} to be healthy");
                }
                enactors.push((deps, config));
            }
            "dnsplan" => {
                let cli = dnsplan_cli::args::Cli::try_parse_from(&command)?;
                let dnsplan_cli::args::Command::DemoBackend { http, tcp, .. } = cli.command else {
                    anyhow::bail!("{name}: only demo-backend runs as a service");
                };
                assert!(http.iter().any(|a| a.port() == health_port), "{name}: healthcheck port {health_port} is not an HTTP listener");
                backends.insert(IpAddr::V4(ip.expect("backends need fixed addresses")), (http, tcp));
            }
            other => anyhow::bail!("{name}: {other:?} is not one of our binaries"),
        }
    }
    assert_eq!(prefixes.len(), 1, "every daemon uses the same store.prefix: {prefixes:?}");
    assert_eq!(authorities.len(), 2, "two authorities");
    // The SOA serial is serial_base plus the content-change count etcd holds: one DNS zone and
    // one serial_base make both serve the same serial for the same state.
    let zones: BTreeSet<(String, Option<u32>)> =
        authorities.values().map(|(_, c)| (c.dns_zone.origin.clone(), c.dns_zone.soa.as_ref().map(|s| s.serial_base))).collect();
    assert_eq!(zones.len(), 1, "the authorities serve one DNS zone with one serial_base: {zones:?}");
    assert_eq!(planners.len(), 1, "one planner");
    assert_eq!(enactors.len(), 3, "three enactors");
    let zones: BTreeSet<String> = enactors.iter().map(|(_, e)| e.zone.to_string()).collect();
    assert_eq!(zones, ["a", "b", "c"].iter().map(|z| z.to_string()).collect());
    assert_eq!(enactors.iter().map(|(_, e)| e.id.as_str()).collect::<BTreeSet<_>>().len(), 3, "enactor ids must differ");
    for (deps, e) in &enactors {
        assert!(e.verify.enabled, "{}: verify", e.id);
        let (verified, (_, authority)) = authorities
            .iter()
            .find(|(_, (ip, _))| e.verify.dns_server.ip() == IpAddr::V4(*ip))
            .unwrap_or_else(|| panic!("{}: verify.dns_server {} is no authority", e.id, e.verify.dns_server));
        assert!(authority.dns.listen.iter().any(|a| a.port() == e.verify.dns_server.port()), "{}: verify port", e.id);
        assert_eq!(deps.get(verified), Some(&true), "{}: waits for {verified}, which it verifies against", e.id);
    }
    let planner = &planners[0];
    for (_, authority) in authorities.values() {
        assert_eq!(planner.dns_zone.to_string(), authority.dns_zone.origin);
    }
    for ep in planner.endpoints() {
        for t in &ep.targets {
            let (http, tcp) = backends.get(&t.address).unwrap_or_else(|| panic!("{}: target {} is no backend service", ep.name, t.address));
            let listening = match &ep.check_for(t).expect("checks are required").probe {
                dnsplan_planner::config::Probe::Http { port, .. } => http.iter().any(|a| a.port() == *port),
                dnsplan_planner::config::Probe::Tcp { port } => tcp.iter().any(|a| a.port() == *port),
            };
            assert!(listening, "{}: the check of {} has no listener on its backend", ep.name, t.address);
        }
    }

    // Host ports: none twice in this file, none also published by docker-compose.yml.
    let (_, single) = load_compose("docker-compose.yml")?;
    let mut seen = BTreeMap::new();
    for (name, port, proto) in host_ports(&single).into_iter().chain(host_ports(&services)) {
        if let Some(other) = seen.insert((port, proto.clone()), name.clone()) {
            panic!("host port {port}/{proto} is published by {other} and by {name}");
        }
    }
    Ok(())
}
