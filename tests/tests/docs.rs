//! The documentation against the config types, so that neither can drift from the other.
//!
//! `every_toml_snippet_parses_with_its_config_type`: every ```` ```toml ```` block of README.md
//! and docs/*.md starts with a comment naming the file it belongs in (`# authority.toml`,
//! `# enactor.toml`, `# planner.toml`, `# dnsplan.toml`, or `# keys.toml` for a DNSSEC key
//! directory's schedule, checked whole); a block without one fails. A block
//! may be a fragment: it is merged over that file's example in `examples/` (tables merged key
//! by key, the block's values winning; a table the block gives a `kind` replaces the example's
//! whole, since its keys depend on its kind: `[store]`, `[target]`), and the result is
//! deserialised into the daemon's own config type (`AuthorityConfig`, `EnactorConfig`,
//! `PlannerConfig`, cli's `UpConfig`), all of which refuse unknown keys
//! (`deny_unknown_fields`), then checked as far as that needs no files: `AuthorityConfig::check`,
//! `PlannerConfig::validate`, `EnactorConfig::check` for a store target, `Stack::load` for
//! `dnsplan.toml`. A failure names the file, the line and the error. Teeth: with `address`
//! renamed `adress` in the README's `# dnsplan.toml` block it failed with "README.md:177: as
//! dnsplan.toml: unknown field `adress`, expected one of `address`, `key`, `notify`" (checked
//! once).
//!
//! `the_configuration_reference_lists_every_key`: the keys each config type takes are traced
//! from the types themselves (a `serde::Deserializer` that records the fields every struct asks
//! for, below), and each must appear, in backticks, in its file's section of
//! docs/configuration.md (`store.*` in the `[store]` section); `dnsplan.toml`'s sections that
//! take another file's keys (`authority.dns.*` is `authority.toml`'s `dns.*`, ...) are checked
//! there, and must be that file's keys. The other way round, the first cell of every table row
//! there must be a key (or a table) its type takes. Teeth: with the row of
//! `apply.full_write_every` removed from the reference it failed with "enactor.toml:
//! apply.full_write_every", and with a row for a key `apply.batch_bytes` added, with
//! "`enactor.toml`: apply.batch_bytes" (checked once each).
//!
//! `every_link_between_the_docs_resolves`: every relative link of README.md and docs/*.md
//! (outside code blocks) names a file that exists and, with `#anchor`, a heading of that file
//! (GitHub's anchors: lower case, punctuation dropped, spaces as `-`), so that moving a guide
//! or renaming a section cannot leave a link dangling. Teeth: with the README's link to
//! `docs/etcd.md` changed to `docs/etc.md` it failed with "README.md:196: docs/etc.md: no such
//! file", and with the anchor `#the-soa-serial` changed to `#the-serial`, with
//! "docs/runbook.md:117: secondaries.md#the-serial: no such heading" (checked once each).

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_cli::up::{Overrides, Stack, UpConfig};
use dnsplan_enactor::config::{EnactorConfig, Rfc2136Config, TargetConfig};
use dnsplan_planner::config::PlannerConfig;
use serde::de::value::{BorrowedStrDeserializer, Error as DeError};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every docs/*.md, in name order.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root().join("README.md"));
    docs
}

/// A ```` ```toml ```` block: where its opening fence is (1-based) and its text.
struct Snippet {
    line: usize,
    text: String,
}

fn toml_snippets(markdown: &str) -> Vec<Snippet> {
    let mut snippets = Vec::new();
    let mut open: Option<Snippet> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```toml") => open = Some(Snippet { line: i + 1, text: String::new() }),
            Some(_) if fence.starts_with("```") => snippets.extend(open.take()),
            Some(snippet) => {
                snippet.text.push_str(line);
                snippet.text.push('\n');
            }
            None => {}
        }
    }
    snippets
}

/// `base` with `over` merged in: tables key by key, `over`'s values winning; a table of `over`
/// with a `kind` replaces the base's whole.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) if !o.contains_key("kind") => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// The line, inside `text`, of a byte offset (0-based).
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count()
}

/// Parses `snippet` (its marker already read) as `file`; the error says what and where
/// inside the snippet, when TOML can tell.
fn check_snippet(file: &str, snippet: &str) -> Result<(), (Option<usize>, String)> {
    // Where an unknown key is, from the snippet alone (the merged text has other lines).
    fn locate<T: serde::de::DeserializeOwned>(snippet: &str) -> Option<usize> {
        let err = toml::from_str::<T>(snippet).err()?;
        if !err.message().contains("unknown field") {
            return None;
        }
        err.span().map(|span| line_of(snippet, span.start))
    }
    fn parse<T: serde::de::DeserializeOwned>(snippet: &str, merged: &str) -> Result<T, (Option<usize>, String)> {
        toml::from_str::<T>(merged).map_err(|e| (locate::<T>(snippet), e.message().to_owned()))
    }

    // A key directory's schedule has no example to merge over: the block is whole.
    if file == "keys.toml" {
        return dnsplan_common::dnssec_keys::check_schedule(snippet).map_err(|e| (None, e));
    }
    let example = std::fs::read_to_string(root().join("examples").join(file)).map_err(|e| (None, format!("examples/{file}: {e}")))?;
    let mut table: toml::Table = toml::from_str(&example).map_err(|e| (None, format!("examples/{file}: {e}")))?;
    let over: toml::Table = toml::from_str(snippet).map_err(|e| (e.span().map(|s| line_of(snippet, s.start)), e.message().to_owned()))?;
    merge(&mut table, over);
    let merged = toml::to_string(&table).map_err(|e| (None, format!("the merged config does not serialise: {e}")))?;
    match file {
        "authority.toml" => parse::<AuthorityConfig>(snippet, &merged)?.check().map_err(|e| (None, e)),
        "enactor.toml" => {
            let config = parse::<EnactorConfig>(snippet, &merged)?;
            // An RFC 2136 target's check needs its key, read from a file by `load`.
            match config.target {
                TargetConfig::Store => config.check().map_err(|e| (None, e)),
                TargetConfig::Rfc2136(_) => Ok(()),
            }
        }
        "planner.toml" => parse::<PlannerConfig>(snippet, &merged)?.validate(&merged).map_err(|e| (None, e)),
        "dnsplan.toml" => {
            parse::<UpConfig>(snippet, &merged)?;
            let dir = tempfile::tempdir().map_err(|e| (None, e.to_string()))?;
            let path = dir.path().join("dnsplan.toml");
            std::fs::write(&path, &merged).map_err(|e| (None, e.to_string()))?;
            Stack::load(Some(&path), Overrides::default()).map(drop).map_err(|e| (None, format!("{e:#}")))
        }
        other => Err((
            None,
            format!(
                "{other:?} is not a config file; start the block with # authority.toml, # enactor.toml, # planner.toml, # dnsplan.toml or # keys.toml"
            ),
        )),
    }
}

#[test]
fn every_toml_snippet_parses_with_its_config_type() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("readable");
        let shown = doc.strip_prefix(root()).unwrap_or(&doc).display().to_string();
        for snippet in toml_snippets(&text) {
            let marker = snippet.text.lines().next().and_then(|l| l.strip_prefix("# ")).map(str::trim);
            let Some(file) = marker.filter(|m| m.ends_with(".toml")) else {
                failures
                    .push(format!("{shown}:{}: a toml block must start with the file it belongs in, e.g. # authority.toml", snippet.line));
                continue;
            };
            checked += 1;
            if let Err((at, err)) = check_snippet(file, &snippet.text) {
                // The fence is line `snippet.line`; the snippet's first line is the next one.
                let line = snippet.line + 1 + at.unwrap_or(0);
                failures.push(format!("{shown}:{line}: as {file}: {err}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} of the toml blocks do not parse:\n{}", failures.len(), failures.join("\n"));
    assert!(checked >= 5, "only {checked} toml blocks found: is the extraction broken?");
}

// --- The keys a config type takes, traced from its `Deserialize` ---

/// Field paths as written in the reference: `dns.rrl.enabled`, `dns.transfer.keys[].name`.
#[derive(Default)]
struct Trace {
    /// Every field path a struct asked for, with the field names that lead to it.
    fields: BTreeMap<String, Vec<&'static str>>,
    /// Paths at which a struct was deserialised (tables, not keys).
    tables: BTreeSet<String>,
}

/// A `Deserializer` that follows `probe` (field names) down from `path`, records the fields of
/// every struct on the way, and fails at anything else: the error ends one probe, and the trace
/// runs one probe per field so that each is reached on its own.
struct Tracer<'t> {
    trace: &'t mut Trace,
    path: String,
    names: Vec<&'static str>,
    probe: &'t [&'static str],
}

/// How `toml::Spanned<T>` names its struct and fields: transparent here, only `T` counts.
const SPANNED: &str = "$__serde_spanned_private_";

impl<'de> Deserializer<'de> for Tracer<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, DeError> {
        Err(de::Error::custom(format!("{}: a value, not a table", self.path)))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name.starts_with(SPANNED) {
            // `toml::Spanned<T>`: a struct of start, end and the value; only the value counts.
            let value = fields.iter().copied().find(|f| f.ends_with("value")).unwrap_or_default();
            return visitor.visit_map(OneField { key: Some(value), value: Some(self) });
        }
        self.trace.tables.insert(self.path.clone());
        for field in fields {
            let path = if self.path.is_empty() { (*field).to_owned() } else { format!("{}.{field}", self.path) };
            let mut names = self.names.clone();
            names.push(field);
            self.trace.fields.entry(path).or_insert(names);
        }
        match self.probe.split_first() {
            Some((next, rest)) if fields.contains(next) => {
                let path = if self.path.is_empty() { (*next).to_owned() } else { format!("{}.{next}", self.path) };
                let mut names = self.names;
                names.push(next);
                let inner = Tracer { trace: self.trace, path, names, probe: rest };
                visitor.visit_map(OneField { key: Some(next), value: Some(inner) })
            }
            _ => Err(de::Error::custom("traced")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let path = format!("{}[]", self.path);
        visitor.visit_seq(OneElement(Some(Tracer { trace: self.trace, path, names: self.names, probe: self.probe })))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct tuple tuple_struct map enum identifier ignored_any
    }
}

struct OneField<'t> {
    key: Option<&'static str>,
    value: Option<Tracer<'t>>,
}

impl<'de> MapAccess<'de> for OneField<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        match self.key.take() {
            Some(key) => seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        match self.value.take() {
            Some(tracer) => seed.deserialize(tracer),
            None => Err(de::Error::custom("no value")),
        }
    }
}

struct OneElement<'t>(Option<Tracer<'t>>);

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DeError> {
        self.0.take().map(|tracer| seed.deserialize(tracer)).transpose()
    }
}

/// Every key `T` takes, as paths: the fields of every struct reachable from it, less the ones
/// that are themselves tables (or arrays of tables).
fn keys_of<T: serde::de::DeserializeOwned>() -> BTreeSet<String> {
    let mut trace = Trace::default();
    let mut probed = BTreeSet::new();
    let mut queue: VecDeque<Vec<&'static str>> = VecDeque::from([Vec::new()]);
    while let Some(probe) = queue.pop_front() {
        if !probed.insert(probe.clone()) {
            continue;
        }
        let tracer = Tracer { trace: &mut trace, path: String::new(), names: Vec::new(), probe: &probe };
        // Every probe ends in an error by design; what it recorded is the point.
        let _ = T::deserialize(tracer);
        queue.extend(trace.fields.values().filter(|names| !probed.contains(*names)).cloned());
    }
    let tables = &trace.tables;
    trace.fields.into_keys().filter(|k| !tables.contains(k) && !tables.contains(&format!("{k}[]"))).collect()
}

/// `enactor.toml`'s keys: its `[target]` is an internally tagged enum, traced as `kind` and the
/// keys of its one variant with fields.
fn enactor_keys() -> BTreeSet<String> {
    let mut keys = keys_of::<EnactorConfig>();
    assert!(keys.remove("target"), "[target] is no longer one tagged value: trace it as a table");
    keys.insert("target.kind".into());
    keys.extend(keys_of::<Rfc2136Config>().into_iter().map(|k| format!("target.{k}")));
    keys
}

/// The `## ` sections of the reference, by heading.
fn sections(reference: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    let mut heading = String::new();
    for line in reference.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            heading = h.to_owned();
        }
        let text: &mut String = sections.entry(heading.clone()).or_default();
        text.push_str(line);
        text.push('\n');
    }
    sections
}

fn section<'s>(sections: &'s BTreeMap<String, String>, marker: &str) -> &'s str {
    let found: Vec<&String> = sections.keys().filter(|h| h.contains(marker)).collect();
    assert_eq!(found.len(), 1, "docs/configuration.md: want one section whose heading has {marker}, found {found:?}");
    &sections[found[0]]
}

/// The first cell of every table row, when it is one key in backticks.
fn row_keys(section: &str) -> Vec<&str> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(key, _)| key))
        .filter(|key| !key.contains(' ') && !key.starts_with('['))
        .collect()
}

/// `key` is one of `keys`, or a table above some of them.
fn names_a_key(key: &str, keys: &BTreeSet<String>) -> bool {
    keys.iter().any(|k| k == key || k.starts_with(&format!("{key}.")) || k.starts_with(&format!("{key}[")))
}

#[test]
fn the_configuration_reference_lists_every_key() {
    let reference = std::fs::read_to_string(root().join("docs/configuration.md")).expect("docs/configuration.md is readable");
    let sections = sections(&reference);
    let store = section(&sections, "`[store]`");
    let authority = keys_of::<AuthorityConfig>();
    let enactor = enactor_keys();
    let planner = keys_of::<PlannerConfig>();
    let up = keys_of::<UpConfig>();
    for (name, keys) in [("authority", &authority), ("enactor", &enactor), ("planner", &planner), ("up", &up)] {
        assert!(keys.len() >= 7, "only {} keys traced for {name}: {keys:?}; is the tracer broken?", keys.len());
    }
    let files = [("authority.toml", &authority), ("enactor.toml", &enactor), ("planner.toml", &planner)];
    // dnsplan.toml's sections that take another file's keys: (its prefix, the file, the prefix there).
    let shared = [
        ("authority.dns.", "authority.toml", "dns."),
        ("authority.dns_zone.", "authority.toml", "dns_zone."),
        ("authority.zones[].", "authority.toml", "zones[]."),
        ("enactors.apply.", "enactor.toml", "apply."),
        ("enactors.cleanup.", "enactor.toml", "cleanup."),
        ("planner.planner.", "planner.toml", "planner."),
        ("planner.policy.", "planner.toml", "policy."),
        ("planner.endpoint[].", "planner.toml", "endpoint[]."),
        ("planner.zone[].", "planner.toml", "zone[]."),
    ];

    let mut missing = BTreeSet::new();
    let mut listed = |file: &str, key: &str, text: &str| {
        // `[[zones]]` takes `[dns_zone]`'s keys: documented there, beside the `zones` row.
        // A planner's `[[zone]]` takes `[[endpoint]]`'s and `[policy]`'s keys: documented
        // there, beside the `zone[].endpoint` and `zone[].policy` rows.
        let key = match (key.strip_prefix("zones[]."), key.strip_prefix("zone[].endpoint[]."), key.strip_prefix("zone[].policy.")) {
            (Some(rest), _, _) if file == "authority.toml" && text.contains("`zones`") => format!("dns_zone.{rest}"),
            (_, Some(rest), _) if file == "planner.toml" && text.contains("`zone[].endpoint`") => format!("endpoint[].{rest}"),
            (_, _, Some(rest)) if file == "planner.toml" && text.contains("`zone[].policy`") => format!("policy.{rest}"),
            _ => key.to_string(),
        };
        if !text.contains(&format!("`{key}`")) {
            missing.insert(format!("{file}: {key}"));
        }
    };
    for (file, keys) in files {
        let own = section(&sections, &format!("`{file}`"));
        for key in keys.iter() {
            listed(file, key, if key.starts_with("store.") { store } else { own });
        }
    }
    let own = section(&sections, "`dnsplan.toml`");
    let mut not_shared = Vec::new();
    for key in &up {
        match shared.iter().find(|(prefix, _, _)| key.starts_with(prefix)) {
            Some((prefix, file, there)) => {
                let key_there = format!("{there}{}", &key[prefix.len()..]);
                let (_, keys) = files.iter().find(|(f, _)| f == file).expect("a file above");
                if !keys.contains(&key_there) {
                    not_shared.push(format!("dnsplan.toml: {key} is not {file}'s {key_there}"));
                }
                listed(file, &key_there, section(&sections, &format!("`{file}`")));
            }
            None => listed("dnsplan.toml", key, own),
        }
    }
    assert!(not_shared.is_empty(), "the test's map of dnsplan.toml's shared sections is wrong:\n{}", not_shared.join("\n"));
    let missing: Vec<String> = missing.into_iter().collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not list these keys (in backticks, in their file's section):\n{}",
        missing.join("\n")
    );

    // And every key the reference lists is one the types take.
    let all_daemons: BTreeSet<String> = authority.iter().chain(&enactor).chain(&planner).cloned().collect();
    let mut unknown = Vec::new();
    for (marker, keys) in [
        ("`authority.toml`", &authority),
        ("`enactor.toml`", &enactor),
        ("`planner.toml`", &planner),
        ("`dnsplan.toml`", &up),
        ("`[store]`", &all_daemons),
    ] {
        for key in row_keys(section(&sections, marker)) {
            if !names_a_key(key, keys) {
                unknown.push(format!("{marker}: {key}"));
            }
        }
    }
    assert!(unknown.is_empty(), "docs/configuration.md lists keys no config type takes:\n{}", unknown.join("\n"));
}

/// Every `](target)` of a markdown text outside fenced code blocks, with its line.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((i + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    found
}

/// GitHub's anchor of a heading: lower case, backticks and punctuation dropped, spaces as `-`.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(anchor_of(line.trim_start_matches('#')));
        }
    }
    found
}

#[test]
fn every_link_between_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("readable");
        let shown = doc.strip_prefix(root()).unwrap_or(&doc).display().to_string();
        let dir = doc.parent().map(Path::to_path_buf).unwrap_or_else(root);
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let path = if file.is_empty() { doc.clone() } else { dir.join(file) };
            if !path.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            }
            if !anchor.is_empty() {
                let headings = std::fs::read_to_string(&path).map(|t| anchors(&t)).unwrap_or_default();
                if !headings.contains(anchor) {
                    broken.push(format!("{shown}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links that lead nowhere:\n{}", broken.join("\n"));
    assert!(checked >= 10, "only {checked} links found: is the extraction broken?");
}
