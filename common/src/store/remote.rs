//! `RemoteStore`: the `Store` contract over the authority's control API (HTTP).
//!
//! Every call has a timeout; transport failures become [`StoreError::Unavailable`] and the
//! server's refusals come back as the same typed errors the server's store returned (see
//! [`super::wire`]). Inputs are validated here too, before they travel, so an invalid
//! endpoint is refused on both sides of the wire.

use super::wire::{
    AcquireLeaseRequest, ActiveQuery, ApplyManyRequest, ApplyManyResponse, ApplyRequest, CleanupRequest, ErrorBody, LEASE_EPOCH_HEADER,
    LEASE_HOLDER_HEADER, RetireRequest, WaitQuery,
};
use super::zones::{INCARNATION_HEADER, ManagedZone, ManagedZones, RegistryVersion};
use super::{
    ActiveDelta, ActivePage, ActiveRecord, ActiveSnapshot, ApplyItem, ApplyOutcome, CleanupDecision, CleanupReport, GenerationBase,
    Heartbeat, KeysBody, KeysPut, KeysRecord, Lease, PauseState, Store, StoreError, StoreResult, StoreVersion,
};
use crate::changes::{PlanChanges, decode_changes};
use crate::codec;
use crate::delta::PlanDelta;
use crate::generation::Generation;
use crate::names::{DnsName, EndpointName};
use crate::plan::{Endpoint, PlanSummary, ValidatedPlan, validate_endpoint};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;

/// Timeout of every control API call except long-polls, which get their wait plus this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connect timeout: the control API is local or on the same network.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Idle connections are dropped after this long, before the authority closes them (its
/// `control.header_timeout_secs`, 10 s by default), so no request goes out on a connection
/// the server is closing.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS to an `https://` control API: the CA that signed its certificate (PEM; the system's
/// roots are not used, as for etcd) and this client's certificate and key, when it presents
/// one (a `client_cert` credential).
pub struct ClientTls<'a> {
    pub ca: &'a [u8],
    pub identity: Option<(&'a [u8], &'a [u8])>,
}

/// An HTTP client builder for the control API at `base`: plain for `http://`, rustls with
/// `tls` for `https://` (which then needs it). Every client of the control API starts here.
pub fn client_builder(base: &str, tls: Option<&ClientTls<'_>>) -> Result<reqwest::ClientBuilder, String> {
    let https = base.starts_with("https://");
    let builder = reqwest::Client::builder();
    match (https, tls) {
        (false, None) => Ok(builder),
        (false, Some(_)) => Err(format!("{base}: a CA file is given, but the URL is not https://")),
        (true, None) => Err(format!("{base}: an https:// control API needs the CA that signed its certificate (a CA file)")),
        (true, Some(tls)) => {
            let roots = reqwest::Certificate::from_pem_bundle(tls.ca).map_err(|e| format!("the CA file is not PEM certificates: {e}"))?;
            if roots.is_empty() {
                return Err("the CA file holds no certificate".into());
            }
            let mut builder = builder.use_rustls_tls().tls_built_in_root_certs(false).https_only(true);
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
            if let Some((cert, key)) = tls.identity {
                let identity = reqwest::Identity::from_pem(&[cert, b"\n", key].concat())
                    .map_err(|e| format!("the client certificate and key are not a usable PEM pair: {e}"))?;
                builder = builder.identity(identity);
            }
            Ok(builder)
        }
    }
}

#[derive(Clone)]
pub struct RemoteStore {
    inner: Arc<Inner>,
    /// The added zone this handle calls (`/v1/managed/{zone}/...`) and its incarnation, sent
    /// with each call; `None` for the store's first zone (`/v1/...`).
    zone: Option<(DnsName, u64)>,
}

struct Inner {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
    /// The authority refused a batch envelope as a body it cannot read (one from before
    /// envelopes were taken): batches go as JSON from then on.
    json_batches: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is never printed.
        f.debug_struct("RemoteStore").field("base", &self.inner.base).field("zone", &self.zone).finish_non_exhaustive()
    }
}

fn transport(base: &str, err: reqwest::Error) -> StoreError {
    let what = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect (is the authority running?)"
    } else {
        "request failed"
    };
    StoreError::Unavailable(format!("control API at {base} {what}: {err}"))
}

impl RemoteStore {
    /// `base` is the control API's URL, such as `http://127.0.0.1:8053`. `token` is needed for
    /// writes.
    pub fn new(base: &str, token: Option<String>) -> StoreResult<RemoteStore> {
        RemoteStore::with_tls(base, token, None)
    }

    /// As `new`, to an `https://` control API with `tls`.
    pub fn with_tls(base: &str, token: Option<String>, tls: Option<&ClientTls<'_>>) -> StoreResult<RemoteStore> {
        let client = client_builder(base, tls)
            .map_err(StoreError::Unavailable)?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("cannot build an HTTP client: {e}")))?;
        Ok(RemoteStore {
            inner: Arc::new(Inner { client, base: base.trim_end_matches('/').to_owned(), token, json_batches: Default::default() }),
            zone: None,
        })
    }

    /// `path` is a route of the first zone's (`/v1/...`); a zone handle's goes to its zone.
    fn url(&self, path: &str) -> String {
        match (&self.zone, path.strip_prefix("/v1/")) {
            (Some((zone, _)), Some(rest)) => format!("{}/v1/managed/{zone}/{rest}", self.inner.base),
            _ => format!("{}{path}", self.inner.base),
        }
    }

    /// The base URL, for the store's own routes whatever zone this handle calls.
    fn root_url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.base)
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let req = match &self.zone {
            Some((_, incarnation)) => req.header(INCARNATION_HEADER, incarnation.to_string()),
            None => req,
        };
        match &self.inner.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> StoreResult<reqwest::Response> {
        let resp = self.authed(req).send().await.map_err(|e| transport(&self.inner.base, e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| transport(&self.inner.base, e))?;
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(err) => Err(err.error.into()),
            Err(_) => Err(StoreError::Unavailable(format!(
                "control API at {} answered {status} without a dnsplan error body: {}",
                self.inner.base,
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))),
        }
    }

    async fn json<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> StoreResult<T> {
        let resp = self.send(req).await?;
        let bytes = resp.bytes().await.map_err(|e| transport(&self.inner.base, e))?;
        serde_json::from_slice(&bytes).map_err(|e| StoreError::Unavailable(format!("control API sent a body this client cannot read: {e}")))
    }

    /// `POST /v1/apply` with the batch as a codec envelope; as JSON to an authority that
    /// answered an envelope with a body error that is not its own (an older authority reads
    /// JSON only), so enactors can be upgraded before the authority.
    async fn send_batch(&self, body: &ApplyManyRequest) -> StoreResult<ApplyManyResponse> {
        use std::sync::atomic::Ordering;
        let url = self.url("/v1/apply");
        if !self.inner.json_batches.load(Ordering::Relaxed) {
            let req = self.inner.client.post(&url).header("content-type", "application/octet-stream").body(codec::encode(body));
            match self.json(req).await {
                Err(StoreError::BadRequest(detail)) if !detail.contains("apply batch envelope") => {
                    tracing::info!(control = %self.inner.base, detail = %detail, "the control API does not read batch envelopes; sending batches as JSON");
                    self.inner.json_batches.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        self.json(self.inner.client.post(&url).json(body)).await
    }

    fn endpoint_path(endpoint: &EndpointName) -> String {
        // DNS names hold only letters, digits, '-', '_' and '.', all safe in a URL path.
        format!("/v1/active/{}", endpoint.as_str())
    }
}

impl Store for RemoteStore {
    /// An added zone's handle knows its zone; the first zone's is its latest plan's.
    async fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
        if let Some((zone, _)) = &self.zone {
            return Ok(Some(zone.clone()));
        }
        match self.latest().await? {
            Generation::NONE => Ok(None),
            latest => Ok(Some(self.plan(latest).await?.into_plan().dns_zone)),
        }
    }

    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        let body = codec::encode_plan(plan);
        let req = self.inner.client.post(self.url("/v1/plans")).header("content-type", "application/octet-stream").body(body);
        self.send(req).await.map(|_| ())
    }

    async fn publish_changes(&self, delta: &PlanDelta, lease: Option<&Lease>) -> StoreResult<()> {
        delta.check()?;
        let path = format!("/v1/plans/{}/changes", delta.generation());
        let mut req = self.inner.client.post(self.url(&path)).header("content-type", "application/octet-stream");
        if let Some(lease) = lease {
            req = req.header(LEASE_HOLDER_HEADER, &lease.holder).header(LEASE_EPOCH_HEADER, lease.epoch.to_string());
        }
        self.send(req.body(codec::encode(delta))).await.map(|_| ())
    }

    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        let body = codec::encode_plan(plan);
        let req = self
            .inner
            .client
            .post(self.url("/v1/plans"))
            .header("content-type", "application/octet-stream")
            .header(LEASE_HOLDER_HEADER, &lease.holder)
            .header(LEASE_EPOCH_HEADER, lease.epoch.to_string())
            .body(body);
        self.send(req).await.map(|_| ())
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let body = AcquireLeaseRequest { holder: holder.to_owned(), ttl_ms: ttl.as_millis() as u64 };
        self.json(self.inner.client.post(self.url("/v1/lease")).json(&body)).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.send(self.inner.client.delete(self.url("/v1/lease")).json(lease)).await.map(|_| ())
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        self.json(self.inner.client.get(self.url("/v1/lease"))).await
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        let resp = self.send(self.inner.client.get(self.url(&format!("/v1/plans/{generation}")))).await?;
        let bytes = resp.bytes().await.map_err(|e| transport(&self.inner.base, e))?;
        codec::decode_plan(&bytes).map_err(|e| StoreError::Corrupt { what: format!("plan {generation} from the control API"), source: e })
    }

    async fn plan_changes_unchecked(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        let resp = self.send(self.inner.client.get(self.url(&format!("/v1/plans/{to}/changes?from={from}")))).await?;
        if resp.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let bytes = resp.bytes().await.map_err(|e| transport(&self.inner.base, e))?;
        let changes = decode_changes(&bytes)
            .map_err(|e| StoreError::Corrupt { what: format!("changes from plan {from} to {to} from the control API"), source: e })?;
        if (changes.from, changes.to) != (from, to) {
            return Err(StoreError::Unavailable(format!(
                "control API answered changes from plan {} to {} when asked for {from} to {to}",
                changes.from, changes.to
            )));
        }
        Ok(Some(changes))
    }

    async fn latest(&self) -> StoreResult<Generation> {
        Ok(self.version().await?.latest)
    }

    async fn generation_base(&self) -> StoreResult<Generation> {
        let body: GenerationBase = self.json(self.inner.client.get(self.url("/v1/generation-base"))).await?;
        Ok(body.generation)
    }

    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.json(self.inner.client.get(self.url(&format!("/v1/plans?from={from}&limit={limit}")))).await
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        validate_endpoint(endpoint, records)?;
        let body = ApplyRequest { generation, records: records.clone() };
        self.json(self.inner.client.put(self.url(&Self::endpoint_path(endpoint))).json(&body)).await
    }

    async fn apply_many_unchecked(&self, generation: Generation, items: &[ApplyItem]) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        // Invalid items are refused here, one by one, and only the valid ones travel.
        let valid: Vec<StoreResult<()>> =
            items.iter().map(|i| validate_endpoint(&i.endpoint, &i.records).map_err(StoreError::from)).collect();
        let body =
            ApplyManyRequest { generation, items: items.iter().zip(&valid).filter(|(_, v)| v.is_ok()).map(|(i, _)| i.clone()).collect() };
        let answers: ApplyManyResponse = if body.items.is_empty() { Vec::new() } else { self.send_batch(&body).await? };
        if answers.len() != body.items.len() {
            return Err(StoreError::Unavailable(format!(
                "control API answered {} results for a batch of {}",
                answers.len(),
                body.items.len()
            )));
        }
        let mut answers = answers.into_iter();
        Ok(valid
            .into_iter()
            .map(|v| match v {
                Err(e) => Err(e),
                Ok(()) => answers
                    .next()
                    .map_or_else(|| Err(StoreError::Unavailable("missing batch result".into())), |r| r.map_err(StoreError::from)),
            })
            .collect())
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        let path = format!("{}/retire", Self::endpoint_path(endpoint));
        self.json(self.inner.client.post(self.url(&path)).json(&RetireRequest { generation })).await
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.json(self.inner.client.get(self.url(&Self::endpoint_path(endpoint)))).await
    }

    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        self.json(self.inner.client.get(self.url("/v1/active"))).await
    }

    async fn active_page_unchecked(&self, after: Option<EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        let query = ActiveQuery { after: after.map(|a| a.as_str().to_owned()), limit: Some(limit) };
        self.json(self.inner.client.get(self.url("/v1/active")).query(&query)).await
    }

    async fn active_since(&self, since: u64) -> StoreResult<ActiveDelta> {
        // An envelope when the authority sends one; an authority from before envelopes
        // answers JSON, read as before.
        let req = self.inner.client.get(self.url(&format!("/v1/changes?since={since}"))).header("accept", "application/octet-stream");
        let resp = self.send(req).await?;
        let envelope = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/octet-stream"));
        let bytes = resp.bytes().await.map_err(|e| transport(&self.inner.base, e))?;
        if envelope {
            return codec::decode(&bytes)
                .map_err(|e| StoreError::Corrupt { what: format!("changes since {since} from the control API"), source: e });
        }
        serde_json::from_slice(&bytes).map_err(|e| StoreError::Unavailable(format!("control API sent a body this client cannot read: {e}")))
    }

    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        self.json(self.inner.client.get(self.url(&format!("/v1/cleanup?retain={retain}")))).await
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        self.json(self.inner.client.post(self.url("/v1/cleanup")).json(&CleanupRequest { retain })).await
    }

    async fn pause_unchecked(&self, state: PauseState) -> StoreResult<()> {
        self.send(self.inner.client.put(self.url("/v1/pause")).json(&state)).await.map(|_| ())
    }

    async fn resume(&self) -> StoreResult<()> {
        self.send(self.inner.client.delete(self.url("/v1/pause"))).await.map(|_| ())
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.json(self.inner.client.get(self.url("/v1/pause"))).await
    }

    async fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        self.send(self.inner.client.post(self.url("/v1/heartbeats")).json(&heartbeat)).await.map(|_| ())
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.json(self.inner.client.get(self.url("/v1/heartbeats"))).await
    }

    async fn dnssec_keys(&self) -> StoreResult<Option<KeysRecord>> {
        let body: Option<KeysBody> = self.json(self.inner.client.get(self.url("/v1/dnssec-keys"))).await?;
        body.map(|b| {
            let version = b.version.ok_or_else(|| StoreError::Unavailable("control API sent DNSSEC keys without their version".into()))?;
            Ok(KeysRecord { version, bytes: b.bytes()? })
        })
        .transpose()
    }

    async fn put_dnssec_keys_unchecked(&self, expected: Option<u64>, bytes: Vec<u8>) -> StoreResult<KeysPut> {
        self.json(self.inner.client.put(self.url("/v1/dnssec-keys")).json(&KeysBody::new(expected, &bytes))).await
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        self.json(self.inner.client.get(self.url("/v1/version"))).await
    }

    async fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        let q = WaitQuery {
            latest: seen.latest,
            applied_changes: seen.applied_changes,
            control_changes: seen.control_changes,
            timeout_ms: timeout.as_millis() as u64,
        };
        let url = self.url(&format!(
            "/v1/wait?latest={}&applied_changes={}&control_changes={}&timeout_ms={}",
            q.latest, q.applied_changes, q.control_changes, q.timeout_ms
        ));
        self.json(self.inner.client.get(url).timeout(timeout + REQUEST_TIMEOUT)).await
    }
}

impl ManagedZones for RemoteStore {
    /// The handle of added zone `origin`, of the incarnation live now: `HEAD
    /// /v1/managed/{zone}` says which (one zone read, whatever their number); from the whole
    /// registry when the authority does not say.
    async fn zone(&self, origin: &DnsName) -> StoreResult<RemoteStore> {
        let req = self.inner.client.head(self.root_url(&format!("/v1/managed/{origin}")));
        let resp = self.authed(req).send().await.map_err(|e| transport(&self.inner.base, e))?;
        if resp.status() == reqwest::StatusCode::GONE {
            return Err(StoreError::ZoneGone { zone: origin.clone() });
        }
        let said = resp.headers().get(INCARNATION_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if let (true, Some(incarnation)) = (resp.status().is_success(), said) {
            return Ok(RemoteStore { inner: self.inner.clone(), zone: Some((origin.clone(), incarnation)) });
        }
        let zones = self.zones().await?;
        let live = zones.iter().find(|z| &z.origin == origin).and_then(ManagedZone::incarnation);
        let Some(incarnation) = live else { return Err(StoreError::ZoneGone { zone: origin.clone() }) };
        Ok(RemoteStore { inner: self.inner.clone(), zone: Some((origin.clone(), incarnation)) })
    }

    async fn add_zone(&self, origin: &DnsName, master: &str) -> StoreResult<bool> {
        let req = self
            .inner
            .client
            .put(self.root_url(&format!("/v1/managed/{origin}")))
            .header("content-type", "text/dns")
            .body(master.to_owned());
        let resp = self.send(req).await?;
        Ok(resp.status() == reqwest::StatusCode::CREATED)
    }

    async fn zone_master(&self, origin: &DnsName) -> StoreResult<String> {
        let resp = self.send(self.inner.client.get(self.root_url(&format!("/v1/managed/{origin}")))).await?;
        resp.text().await.map_err(|e| transport(&self.inner.base, e))
    }

    async fn remove_zone(&self, origin: &DnsName) -> StoreResult<bool> {
        match self.send(self.inner.client.delete(self.root_url(&format!("/v1/managed/{origin}")))).await {
            Ok(_) => Ok(true),
            Err(StoreError::ZoneGone { .. }) => Ok(false),
            Err(err) => Err(err),
        }
    }

    async fn zones(&self) -> StoreResult<Vec<ManagedZone>> {
        self.json(self.inner.client.get(self.root_url("/v1/managed"))).await
    }

    async fn registry_version(&self) -> StoreResult<u64> {
        let body: RegistryVersion = self.json(self.inner.client.get(self.root_url("/v1/managed-version"))).await?;
        Ok(body.version)
    }

    fn incarnation(&self) -> Option<u64> {
        self.zone.as_ref().map(|(_, incarnation)| *incarnation)
    }
}
