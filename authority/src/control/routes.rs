//! The control API: HTTP routes, one per `Store` operation, over the authority's own store.
//!
//! Who may call which route is `access`'s: credentials with roles, or the one `control.token`
//! (with it alone, reads are open and every write needs it). Plans travel
//! as codec envelopes, everything else as JSON; errors are `ErrorBody` JSON whose `message`
//! says what to do. Bodies are limited per route.
//!
//! Batches, plans and change feeds have a codec-envelope form beside JSON, which `RemoteStore`
//! uses (`application/octet-stream`): `POST /v1/apply` takes an `ApplyManyRequest` envelope,
//! `GET /v1/plans/{g}` sends `Store::plan_envelope` (a plan stored whole goes out as stored,
//! not decoded only to be encoded again), `GET /v1/changes?since=N` answers an `ActiveDelta`
//! envelope to `Accept: application/octet-stream`, `POST /v1/plans/{g}/changes` takes a
//! `PlanDelta`. JSON stays for any client that sends it. Every wire type refuses unknown fields,
//! framework refusals (404, 405, a bad query) get the same JSON error body, and a JSON plan
//! over `JSON_PLAN_BODY_BYTES_MAX` is refused by its declared length before it is read.
//!
//! `access::guard` audits every write with the credential's name; publish, pause, resume,
//! cleanup and zone changes add a line of what they did, on [`AUDIT_TARGET`], written only
//! after the store accepted the operation, every text field Debug-escaped, so a refused
//! operation is never logged as done and a newline in a reason cannot forge a line.

use crate::control::access::{self, Access, Caller};
use crate::metrics::{ApplyLabels, Metrics};
use crate::serving::zones::{ZoneChangeError, ZoneChanges, ZoneTable};
use crate::zone::dns_zone::StaticZone;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use dnsplan_common::codec;
use dnsplan_common::status::{ZoneInfo, ZoneList};
use dnsplan_common::store::wire::{
    AcquireLeaseRequest, ActiveQuery, ApplyManyRequest, ApplyManyResponse, ApplyRequest, ChangesFrom, ChangesQuery, CleanupRequest,
    ErrorBody, LEASE_EPOCH_HEADER, LEASE_HOLDER_HEADER, RetireRequest, WaitQuery, WireError,
};
use dnsplan_common::store::zones::{INCARNATION_HEADER, ManagedZone, ManagedZones, RegistryVersion};
use dnsplan_common::store::{ApplyOutcome, GenerationBase, Heartbeat, KeysBody, KeysPut, Lease, PauseState, StoreError, StoreVersion};
use dnsplan_common::{DnsName, EndpointName, Generation, PlanDelta, PlanEntry};
use hickory_proto::rr::Name;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::limit::GlobalConcurrencyLimitLayer;

/// Largest JSON body (apply, pause, heartbeat, cleanup requests): an endpoint with the maximum
/// number of targets is a few KiB.
pub const JSON_BODY_BYTES_MAX: usize = 64 * 1024;
/// Largest batch apply body: `APPLY_BATCH_MAX` endpoints with the most targets each.
pub const BATCH_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Largest plan body: the envelope header plus the largest plan body the codec accepts.
pub const PLAN_BODY_BYTES_MAX: usize = codec::HEADER_BYTES + codec::BODY_BYTES_MAX;
/// Largest plan sent as JSON (for `curl` and hand-made plans; about 100,000 endpoints). JSON
/// costs several times its size to decode, so a larger body is refused by its declared size,
/// before it is read; larger plans travel as codec envelopes, whose header is checked first.
pub const JSON_PLAN_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Largest master file `PUT /v1/zones/{origin}` takes: about 1,000,000 short records.
pub const ZONE_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The tracing target of audit lines: one per accepted write a person or the planner made.
pub use crate::serving::AUDIT_TARGET;

/// Full-state reads served at once unless `Control::with_full_reads_max` says otherwise (the
/// default of `control.full_reads_max`).
pub const FULL_READS_MAX_DEFAULT: usize = 4;

/// What every handler needs, plus whatever the embedding process adds (`extra` routes).
pub struct Control<S> {
    pub store: S,
    access: Access,
    metrics: Option<Arc<Metrics>>,
    /// Permits for full-state reads (`control.full_reads_max`), shared by their routes.
    full_reads: Arc<Semaphore>,
    /// The static zone a published plan's endpoints must not collide with, when this control
    /// API serves one (`with_zone`).
    zone: Option<Arc<StaticZone>>,
    /// The other zones served, changed through `/v1/zones` (`with_zones`).
    zones: Option<Arc<ZoneTable>>,
    /// The handles of the store's added zones that requests named (`/v1/managed/{zone}/...`),
    /// dropped when one answers that its zone is gone.
    managed: Arc<std::sync::Mutex<std::collections::HashMap<DnsName, S>>>,
    /// Told when a zone was added to the store or removed from it (`with_zone_changes`).
    zone_changes: Option<Arc<ZoneChanges>>,
}

impl<S> Clone for Control<S>
where
    S: Clone,
{
    fn clone(&self) -> Self {
        Control {
            store: self.store.clone(),
            access: self.access.clone(),
            metrics: self.metrics.clone(),
            full_reads: self.full_reads.clone(),
            zone: self.zone.clone(),
            zones: self.zones.clone(),
            managed: self.managed.clone(),
            zone_changes: self.zone_changes.clone(),
        }
    }
}

impl<S: ManagedZones> Control<S> {
    /// The control API of `store`, to callers `access` admits.
    pub fn new(store: S, access: Access) -> Control<S> {
        Control {
            store,
            access,
            metrics: None,
            full_reads: Arc::new(Semaphore::new(FULL_READS_MAX_DEFAULT)),
            zone: None,
            zones: None,
            managed: Default::default(),
            zone_changes: None,
        }
    }

    /// `changed` is told when `/v1/managed` added or removed a zone, so the zones served follow
    /// at once.
    pub fn with_zone_changes(mut self, changed: Arc<ZoneChanges>) -> Control<S> {
        self.zone_changes = Some(changed);
        self
    }

    /// Zone `added` was added to the store, or (`None`) one was removed.
    fn zones_changed(&self, added: Option<&DnsName>) {
        match (&self.zone_changes, added) {
            (Some(changes), Some(origin)) => changes.added(origin.clone()),
            (Some(changes), None) => changes.changed(),
            (None, _) => {}
        }
    }

    /// The store of added zone `origin`, its handle kept for the next request.
    async fn managed_store(&self, origin: &DnsName) -> ApiResult<S> {
        if let Some(store) = self.managed.lock().ok().and_then(|m| m.get(origin).cloned()) {
            return Ok(store);
        }
        let store = self.store.zone(origin).await?;
        if let Ok(mut managed) = self.managed.lock() {
            managed.insert(origin.clone(), store.clone());
        }
        Ok(store)
    }

    /// `/v1/zones` lists and changes `zones`.
    pub fn with_zones(mut self, zones: Arc<ZoneTable>) -> Control<S> {
        self.zones = Some(zones);
        self
    }

    /// Publishes are refused when a served endpoint would collide with `zone`'s static
    /// records (`StaticZone::endpoint_conflict`).
    pub fn with_zone(mut self, zone: Arc<StaticZone>) -> Control<S> {
        self.zone = Some(zone);
        self
    }

    /// 400 naming the first endpoint served by `entries` that collides with the static zone.
    fn check_endpoints<'a>(&self, generation: Generation, entries: impl Iterator<Item = &'a EndpointName>) -> ApiResult<()> {
        let Some(zone) = &self.zone else { return Ok(()) };
        for endpoint in entries {
            let Ok(name) = Name::from_ascii(endpoint.as_str()) else { continue };
            if let Some(why) = zone.endpoint_conflict(&name) {
                return Err(ApiError::bad_request(format!("plan {generation}: endpoint {why}")));
            }
        }
        Ok(())
    }

    /// At most `max` full-state reads at once; more wait their turn (`router` applies it).
    pub fn with_full_reads_max(mut self, max: usize) -> Control<S> {
        assert!(max >= 1);
        self.full_reads = Arc::new(Semaphore::new(max));
        self
    }

    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Control<S> {
        self.metrics = Some(metrics);
        self
    }

    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_deref()
    }

    fn count_apply(&self, result: &Result<ApplyOutcome, StoreError>) {
        let outcome = match result {
            Ok(ApplyOutcome::Switched { .. }) => "switched",
            Ok(ApplyOutcome::Unchanged) => "unchanged",
            Err(StoreError::Stale { .. }) => "stale",
            Err(_) => "refused",
        };
        if let Some(m) = &self.metrics {
            m.applies.get_or_create(&ApplyLabels { outcome }).inc();
        }
    }
}

/// A failed call, rendered as `ErrorBody` JSON with the matching status.
pub struct ApiError {
    error: WireError,
    message: String,
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        let error = WireError::from(&err);
        // The full chain, once, here where it is handled.
        let message = format!("{:#}", DisplayChain(&err));
        ApiError { error, message }
    }
}

struct DisplayChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

impl ApiError {
    pub fn bad_request(detail: impl Into<String>) -> ApiError {
        let detail = detail.into();
        ApiError { message: format!("bad request: {detail}"), error: WireError::BadRequest { detail } }
    }

    fn forbidden(detail: String) -> ApiError {
        ApiError { message: format!("refused: {detail}"), error: WireError::Forbidden { detail } }
    }
}

/// On a response whose call found its zone removed: the zone, so its handle is dropped.
#[derive(Clone)]
struct GoneZone(DnsName);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let gone = match &self.error {
            WireError::ZoneGone { zone } => Some(GoneZone(zone.clone())),
            _ => None,
        };
        let status = StatusCode::from_u16(self.error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // An unavailable store is logged once when it goes and once when it comes back (the
        // follower's reachability), not on every call it fails.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::debug!(message = %self.message, "control API call failed: the store is unavailable");
        } else if status.is_server_error() {
            tracing::error!(message = %self.message, "control API call failed");
        }
        let mut resp = (status, Json(ErrorBody { error: self.error, message: self.message })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if let Some(gone) = gone {
            resp.extensions_mut().insert(gone);
        }
        resp
    }
}

/// The control API of the zone a request names: the store's first zone for `/v1/...`, added
/// zone `Z` for `/v1/managed/Z/...` (the same routes).
pub struct Zoned<S>(pub Control<S>);

impl<S: ManagedZones> axum::extract::FromRequestParts<Control<S>> for Zoned<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, ctl: &Control<S>) -> Result<Zoned<S>, ApiError> {
        let params = axum::extract::RawPathParams::from_request_parts(parts, ctl)
            .await
            .map_err(|e| ApiError::bad_request(format!("the request's path: {}", e.body_text())))?;
        let Some((_, zone)) = params.iter().find(|(key, _)| *key == "zone") else { return Ok(Zoned(ctl.clone())) };
        let origin = DnsName::parse(zone).map_err(|e| ApiError::bad_request(format!("zone {zone:?}: {e}")))?;
        let asked = match parts.headers.get(INCARNATION_HEADER) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| ApiError::bad_request(format!("{INCARNATION_HEADER} {value:?} is not a number")))?,
            ),
        };
        let mut store = ctl.managed_store(&origin).await?;
        if asked.is_some() && store.incarnation() != asked {
            // The handle kept may be of an incarnation removed since: look again, once.
            if let Ok(mut managed) = ctl.managed.lock() {
                managed.remove(&origin);
            }
            store = ctl.managed_store(&origin).await?;
            if store.incarnation() != asked {
                return Err(StoreError::ZoneGone { zone: origin }.into());
            }
        }
        let mut zoned = ctl.clone();
        zoned.store = store;
        // The static records checked at publish are the first zone's.
        zoned.zone = None;
        Ok(Zoned(zoned))
    }
}

/// Drops the handle of a zone a call found removed: a zone added again gets a new one.
async fn forget_gone_zones<S: ManagedZones>(State(ctl): State<Control<S>>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if let Some(GoneZone(zone)) = resp.extensions().get::<GoneZone>()
        && let Ok(mut managed) = ctl.managed.lock()
    {
        managed.remove(zone);
    }
    resp
}

#[derive(Deserialize)]
struct GenerationParam {
    generation: String,
}

#[derive(Deserialize)]
struct EndpointParam {
    endpoint: String,
}

type ApiResult<T> = Result<T, ApiError>;

fn parse_json<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("body is not the expected JSON: {e}")))
}

pub(crate) fn parse_endpoint(raw: &str) -> ApiResult<EndpointName> {
    DnsName::parse(raw).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Compares in time independent of where the first difference is. The length is not secret.
pub fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    let diff = given.iter().zip(expected).fold(0u8, |acc, (a, b)| std::hint::black_box(acc | (a ^ b)));
    diff == 0
}

/// The `/v1` store routes, `/healthz` and `access::guard`. The caller adds `/metrics`,
/// `/readyz` and `/v1/status`, which depend on what else runs in the process, guarded by
/// [`guarded`].
pub fn router<S: ManagedZones>(ctl: Control<S>) -> Router<Control<S>> {
    let zones = Router::new()
        .route("/v1/zones", get(zones_list::<S>))
        .route("/v1/zones/{origin}", put(zone_put::<S>).delete(zone_delete::<S>))
        .layer(DefaultBodyLimit::max(ZONE_BODY_BYTES_MAX));
    let managed = Router::new()
        .route("/v1/managed", get(managed_list::<S>))
        .route("/v1/managed-version", get(managed_version::<S>))
        .route("/v1/managed/{zone}", put(managed_add::<S>).delete(managed_remove::<S>).get(managed_master::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(dnsplan_common::store::zones::MASTER_BYTES_MAX + 1024));
    let added = store_routes("/v1/managed/{zone}", &ctl).route_layer(middleware::from_fn_with_state(ctl.clone(), forget_gone_zones::<S>));
    store_routes("/v1", &ctl)
        .merge(added)
        .merge(zones)
        .merge(managed)
        .route_layer(middleware::from_fn_with_state(ctl.access, access::guard))
        .layer(middleware::map_response(json_for_framework_errors))
}

/// `routes` behind `access::guard`, as `router`'s are: for the routes the process adds.
pub fn guarded<T: Clone + Send + Sync + 'static>(routes: Router<T>, access: &Access) -> Router<T> {
    routes.route_layer(middleware::from_fn_with_state(access.clone(), access::guard))
}

/// The routes of one zone's store under `prefix`: `/v1` for the store's first zone,
/// `/v1/managed/{zone}` for an added one.
fn store_routes<S: ManagedZones>(prefix: &str, ctl: &Control<S>) -> Router<Control<S>> {
    let at = |path: &str| format!("{prefix}{path}");
    let plans = Router::new().route(&at("/plans"), post(publish::<S>).get(list::<S>)).layer(DefaultBodyLimit::max(PLAN_BODY_BYTES_MAX));
    let batches = Router::new().route(&at("/apply"), post(apply_many::<S>)).layer(DefaultBodyLimit::max(BATCH_BODY_BYTES_MAX));
    // Full-state reads share `control.full_reads_max` permits; more wait their turn.
    let full_read = GlobalConcurrencyLimitLayer::with_semaphore(ctl.full_reads.clone());
    let rest = Router::new()
        .route(&at("/plans/{generation}"), get(plan::<S>).layer(full_read.clone()))
        .route(&at("/plans/{generation}/changes"), get(plan_changes::<S>).layer(full_read.clone()).post(publish_changes::<S>))
        .route(&at("/version"), get(version::<S>))
        .route(&at("/generation-base"), get(generation_base::<S>))
        .route(
            &at("/dnssec-keys"),
            get(dnssec_keys::<S>).put(put_dnssec_keys::<S>).layer(DefaultBodyLimit::max(DNSSEC_KEYS_BODY_BYTES_MAX)),
        )
        .route(&at("/wait"), get(wait::<S>))
        .route(&at("/active"), get(active_all::<S>).layer(full_read.clone()))
        .route(&at("/active/{endpoint}"), get(active::<S>).put(apply::<S>))
        .route(&at("/active/{endpoint}/retire"), post(retire::<S>))
        .route(&at("/changes"), get(changes::<S>).layer(full_read))
        .route(&at("/cleanup"), get(cleanup_preview::<S>).post(cleanup::<S>))
        .route(&at("/pause"), get(paused::<S>).put(pause::<S>).delete(resume::<S>))
        .route(&at("/heartbeats"), get(heartbeats::<S>).post(heartbeat::<S>))
        .route(&at("/lease"), get(lease::<S>).post(acquire_lease::<S>).delete(release_lease::<S>))
        .layer(DefaultBodyLimit::max(JSON_BODY_BYTES_MAX));
    plans.merge(batches).merge(rest)
}

/// `GET /v1/managed`: the store's added zones, live and removed.
async fn managed_list<S: ManagedZones>(State(ctl): State<Control<S>>) -> ApiResult<Json<Vec<ManagedZone>>> {
    Ok(Json(ctl.store.zones().await?))
}

/// `PUT /v1/managed/{zone}`: adds zone `zone` to the store, with the master file in the body
/// (its SOA, NS and static records, checked as a zone added at run time is) (201; 200 when it
/// was there).
async fn managed_add<S: ManagedZones>(
    State(ctl): State<Control<S>>,
    caller: Option<Extension<Caller>>,
    Path(zone): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let origin = DnsName::parse(&zone).map_err(|e| ApiError::bad_request(format!("zone {zone:?}: {e}")))?;
    let text = String::from_utf8(body.to_vec()).map_err(|_| ApiError::bad_request("the zone's master file is not UTF-8 text"))?;
    if ctl.zone.as_ref().is_some_and(|z| z.origin.to_lowercase().to_ascii() == origin.as_str()) {
        return Err(
            ZoneChangeError::Conflict(format!("zone {origin} is the store's first zone ([dns_zone]); it is not added again")).into()
        );
    }
    if let (Some(table), Ok(name)) = (&ctl.zones, Name::from_ascii(origin.as_str()))
        && table.is_static(&name)
    {
        return Err(
            ZoneChangeError::Conflict(format!("zone {origin} is served as a static zone; remove it before the store manages it")).into()
        );
    }
    let (at, checked) = (origin.to_string(), text.clone());
    tokio::task::spawn_blocking(move || crate::serving::zones::managed_zone_records(&at, &checked))
        .await
        .map_err(|e| ApiError::bad_request(format!("the zone load failed: {e}")))??;
    if !ctl.store.add_zone(&origin, &text).await? {
        return Ok(StatusCode::OK);
    }
    ctl.zones_changed(Some(&origin));
    let credential = Caller::name_of(caller.as_deref());
    tracing::info!(target: AUDIT_TARGET, zone = ?origin.as_str(), credential = %credential, "managed zone added");
    Ok(StatusCode::CREATED)
}

/// `GET /v1/managed-version`: a number that moves whenever a zone is added or removed
/// (`ManagedZones::registry_version`), so a client follows the registry without reading it
/// whole every time.
async fn managed_version<S: ManagedZones>(State(ctl): State<Control<S>>) -> ApiResult<Json<RegistryVersion>> {
    Ok(Json(RegistryVersion { version: ctl.store.registry_version().await? }))
}

/// `GET /v1/managed/{zone}` (and `HEAD`): the master file zone `zone` was added with, and the
/// incarnation live now in the `dnsplan-zone-incarnation` header (410 when it is not live).
async fn managed_master<S: ManagedZones>(State(ctl): State<Control<S>>, Path(zone): Path<String>) -> ApiResult<Response> {
    let origin = DnsName::parse(&zone).map_err(|e| ApiError::bad_request(format!("zone {zone:?}: {e}")))?;
    let handle = ctl.store.zone(&origin).await?;
    let text = handle.zone_master(&origin).await?;
    let incarnation = handle.incarnation().map(|i| i.to_string()).unwrap_or_default();
    Ok(([(header::CONTENT_TYPE, "text/dns".to_owned()), (header::HeaderName::from_static(INCARNATION_HEADER), incarnation)], text)
        .into_response())
}

/// `DELETE /v1/managed/{zone}`: removes zone `zone`, fencing its late writes (204; 410
/// `ZoneGone` when it was not live).
async fn managed_remove<S: ManagedZones>(
    State(ctl): State<Control<S>>,
    caller: Option<Extension<Caller>>,
    Path(zone): Path<String>,
) -> ApiResult<StatusCode> {
    let origin = DnsName::parse(&zone).map_err(|e| ApiError::bad_request(format!("zone {zone:?}: {e}")))?;
    if !ctl.store.remove_zone(&origin).await? {
        return Err(StoreError::ZoneGone { zone: origin }.into());
    }
    if let Ok(mut managed) = ctl.managed.lock() {
        managed.remove(&origin);
    }
    ctl.zones_changed(None);
    let credential = Caller::name_of(caller.as_deref());
    tracing::info!(target: AUDIT_TARGET, zone = ?origin.as_str(), credential = %credential, "managed zone removed");
    Ok(StatusCode::NO_CONTENT)
}

/// axum's own refusals (body too large, wrong method) are plain text; give them the same
/// JSON error body as ours.
pub(crate) async fn json_for_framework_errors(resp: Response) -> Response {
    let status = resp.status();
    let ours = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"));
    if ours || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let detail = match status {
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "request body too large (limit {JSON_BODY_BYTES_MAX} bytes, batch applies {BATCH_BODY_BYTES_MAX}, plans {PLAN_BODY_BYTES_MAX})"
        ),
        other => format!("HTTP {other}"),
    };
    let error = WireError::BadRequest { detail: detail.clone() };
    (status, Json(ErrorBody { error, message: format!("bad request: {detail}") })).into_response()
}

fn is_json(headers: &HeaderMap, key: header::HeaderName) -> bool {
    headers.get(key).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"))
}

/// A plan body, at most `PLAN_BODY_BYTES_MAX` bytes as a codec envelope or
/// `JSON_PLAN_BODY_BYTES_MAX` as JSON; returns whether it is JSON.
async fn plan_body(headers: &HeaderMap, req: Request) -> ApiResult<(bool, Bytes)> {
    let json = is_json(headers, header::CONTENT_TYPE);
    let (what, max) = if json { ("a JSON plan body", JSON_PLAN_BODY_BYTES_MAX) } else { ("a plan body", PLAN_BODY_BYTES_MAX) };
    let too_long = |len: usize| ApiError::from(StoreError::TooLong { what: what.into(), len, max });
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if let Some(len) = declared.filter(|len| *len > max) {
        return Err(too_long(len));
    }
    let body = axum::body::to_bytes(req.into_body(), max).await.map_err(|_| too_long(declared.unwrap_or(max + 1)))?;
    Ok((json, body))
}

/// The lease a publish is made under: both lease headers, or neither.
fn lease_headers(headers: &HeaderMap) -> ApiResult<Option<Lease>> {
    let header =
        |name: &str| headers.get(name).map(|v| v.to_str().map_err(|_| ApiError::bad_request(format!("header {name} is not text"))));
    match (header(LEASE_HOLDER_HEADER).transpose()?, header(LEASE_EPOCH_HEADER).transpose()?) {
        (Some(holder), Some(epoch)) => {
            let epoch = epoch.parse().map_err(|_| ApiError::bad_request(format!("{LEASE_EPOCH_HEADER} {epoch:?} is not a number")))?;
            Ok(Some(Lease { holder: holder.to_owned(), epoch, expires_at_unix_ms: 0 }))
        }
        (None, None) => Ok(None),
        _ => Err(ApiError::bad_request(format!("send both {LEASE_HOLDER_HEADER} and {LEASE_EPOCH_HEADER}, or neither"))),
    }
}

/// Plans are codec envelopes by default; `Content-Type: application/json` accepts the same
/// plan as JSON (for `curl`), validated exactly the same way.
async fn publish<S: ManagedZones>(Zoned(ctl): Zoned<S>, req: Request) -> ApiResult<StatusCode> {
    let caller = req.extensions().get::<Caller>().cloned();
    let headers = req.headers().clone();
    let (json, body) = plan_body(&headers, req).await?;
    let plan = if json {
        let raw: dnsplan_common::Plan = parse_json(&body)?;
        dnsplan_common::ValidatedPlan::new(raw).map_err(|e| ApiError::from(StoreError::Invalid(e)))?
    } else {
        codec::decode_plan(&body).map_err(|e| ApiError::bad_request(format!("plan envelope: {e}")))?
    };
    may_publish(caller.as_ref(), &plan.plan().author)?;
    ctl.check_endpoints(plan.plan().generation, plan.plan().endpoints.keys())?;
    match lease_headers(&headers)? {
        Some(lease) => ctl.store.publish_leased(&plan, &lease).await?,
        None => ctl.store.publish(&plan).await?,
    }
    let p = plan.plan();
    tracing::info!(
        target: AUDIT_TARGET,
        action = "publish",
        generation = p.generation.0,
        author = ?p.author.to_string(),
        credential = %Caller::name_of(caller.as_ref()),
        reason = ?p.reason,
        rollback_of = ?p.rollback_of.map(|g| g.0),
        retired = p.retired.len(),
        "plan published"
    );
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/plans/{generation}/changes`: plan `generation` as a [`PlanDelta`] against its
/// parent (a codec envelope, or JSON), published through `Store::publish_changes`.
async fn publish_changes<S: ManagedZones>(
    Zoned(ctl): Zoned<S>,
    Path(GenerationParam { generation }): Path<GenerationParam>,
    req: Request,
) -> ApiResult<StatusCode> {
    let g: u64 = generation.parse().map_err(|_| ApiError::bad_request(format!("generation {generation:?} is not a number")))?;
    let caller = req.extensions().get::<Caller>().cloned();
    let headers = req.headers().clone();
    let (json, body) = plan_body(&headers, req).await?;
    let delta: PlanDelta = if json {
        parse_json(&body)?
    } else {
        codec::decode(&body).map_err(|e| ApiError::bad_request(format!("plan changes envelope: {e}")))?
    };
    if delta.generation() != Generation(g) {
        return Err(ApiError::bad_request(format!("the body holds the changes of plan {}, not of plan {g}", delta.generation())));
    }
    may_publish(caller.as_ref(), &delta.head.author)?;
    let served = delta.changes.iter().filter(|(_, entry)| matches!(entry, PlanEntry::Serve(_))).map(|(name, _)| name);
    ctl.check_endpoints(delta.head.generation, served)?;
    ctl.store.publish_changes(&delta, lease_headers(&headers)?.as_ref()).await?;
    let h = &delta.head;
    tracing::info!(
        target: AUDIT_TARGET,
        action = "publish",
        generation = h.generation.0,
        author = ?h.author.to_string(),
        credential = %Caller::name_of(caller.as_ref()),
        reason = ?h.reason,
        rollback_of = ?h.rollback_of.map(|g| g.0),
        changed = delta.changes.len(),
        "plan published as its changes"
    );
    Ok(StatusCode::NO_CONTENT)
}

/// 403 unless the caller's roles allow a plan by `author` (`access::may_publish`). The guard
/// lets no publish through without a caller.
fn may_publish(caller: Option<&Caller>, author: &dnsplan_common::plan::Author) -> ApiResult<()> {
    let Some(caller) = caller else { return Err(ApiError::forbidden("a publish needs a credential".into())) };
    access::may_publish(caller.roles, author).map_err(|why| ApiError::forbidden(format!("credential {:?}: {why}", &*caller.name)))
}

impl From<ZoneChangeError> for ApiError {
    fn from(err: ZoneChangeError) -> ApiError {
        let message = err.to_string();
        let error = match err {
            ZoneChangeError::Invalid(detail) => return ApiError::bad_request(detail),
            ZoneChangeError::Conflict(detail) => WireError::ZoneConflict { detail },
            ZoneChangeError::Missing(detail) => WireError::ZoneNotFound { detail },
            ZoneChangeError::Io { .. } => WireError::Io { detail: format!("{:#}", DisplayChain(&err)) },
        };
        ApiError { error, message }
    }
}

/// The zone table, or 404 when this control API serves none.
fn zone_table<S>(ctl: &Control<S>) -> ApiResult<Arc<ZoneTable>> {
    ctl.zones.clone().ok_or_else(|| ApiError {
        error: WireError::ZoneNotFound { detail: "no zones here".into() },
        message: "this control API serves no DNS zones".into(),
    })
}

/// `GET /v1/zones`: the managed zone and every other zone served.
async fn zones_list<S: ManagedZones>(State(ctl): State<Control<S>>) -> ApiResult<Json<ZoneList>> {
    let table = zone_table(&ctl)?;
    let managed = ctl.zone.as_ref().map(|z| z.origin.to_string()).unwrap_or_default();
    let zones = table
        .list()
        .into_iter()
        .map(|z| ZoneInfo {
            origin: z.origin.to_string(),
            serial: z.serial,
            names: z.names,
            source: z.source.as_str().into(),
            queries: z.queries,
        })
        .collect();
    Ok(Json(ZoneList { managed, zones }))
}

/// `PUT /v1/zones/{origin}`: serves the master file in the body as zone `origin` (added, or
/// replacing one added before with a newer serial), kept on disk first.
async fn zone_put<S: ManagedZones>(State(ctl): State<Control<S>>, Path(origin): Path<String>, body: Bytes) -> ApiResult<Json<ZoneInfo>> {
    let table = zone_table(&ctl)?;
    let text = String::from_utf8(body.to_vec()).map_err(|_| ApiError::bad_request("the zone's master file is not UTF-8 text"))?;
    let (names_table, at) = (table.clone(), origin.clone());
    let serial = tokio::task::spawn_blocking(move || names_table.add_text(&at, &text))
        .await
        .map_err(|e| ApiError::bad_request(format!("the zone load failed: {e}")))??;
    let served = table.get(&Name::from_ascii(&origin).map_err(|e| ApiError::bad_request(e.to_string()))?);
    let (origin, names) = match served {
        Some(s) => {
            let names = s.snapshot.load().entries().filter(|e| e.has_data()).count();
            let origin = s.zone.origin.to_string();
            // Signed with a key directory (`[added_zones.dnssec]`): its keys followed and rolled
            // while the table serves it.
            if let Some(every) = s.zone.signer.as_ref().and_then(|signer| signer.key_check()) {
                let of = crate::serving::KeysOf::Static { notify: crate::xfr::notify::spawn_static, table: table.clone() };
                tokio::spawn(crate::serving::keep_keys(s.clone(), every, of));
            }
            crate::xfr::notify::spawn_static(s);
            (origin, names)
        }
        None => (origin, 0),
    };
    Ok(Json(ZoneInfo { origin, serial, names, source: "added".into(), queries: 0 }))
}

/// `DELETE /v1/zones/{origin}`: stops serving zone `origin`, added at run time.
async fn zone_delete<S: ManagedZones>(State(ctl): State<Control<S>>, Path(origin): Path<String>) -> ApiResult<StatusCode> {
    zone_table(&ctl)?.remove(&origin)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    #[serde(default)]
    from: u64,
    limit: Option<usize>,
}

async fn list<S: ManagedZones>(Zoned(ctl): Zoned<S>, Query(q): Query<ListParams>) -> ApiResult<Response> {
    let limit = q.limit.unwrap_or(dnsplan_common::store::LIST_LIMIT_MAX);
    Ok(Json(ctl.store.list(Generation(q.from), limit).await?).into_response())
}

/// A plan as a codec envelope, or as JSON with `Accept: application/json`.
async fn plan<S: ManagedZones>(
    Zoned(ctl): Zoned<S>,
    headers: HeaderMap,
    Path(GenerationParam { generation }): Path<GenerationParam>,
) -> ApiResult<Response> {
    let g: u64 = generation.parse().map_err(|_| ApiError::bad_request(format!("generation {generation:?} is not a number")))?;
    if is_json(&headers, header::ACCEPT) {
        return Ok(Json(ctl.store.plan(Generation(g)).await?.plan()).into_response());
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], ctl.store.plan_envelope(Generation(g)).await?).into_response())
}

/// What plan `generation` changes since `?from=F`, as a codec envelope (JSON with
/// `Accept: application/json`), or 204 No Content when the store cannot say it in less than
/// the plan.
async fn plan_changes<S: ManagedZones>(
    Zoned(ctl): Zoned<S>,
    headers: HeaderMap,
    Path(GenerationParam { generation }): Path<GenerationParam>,
    Query(q): Query<ChangesFrom>,
) -> ApiResult<Response> {
    let to: u64 = generation.parse().map_err(|_| ApiError::bad_request(format!("generation {generation:?} is not a number")))?;
    let Some(changes) = ctl.store.plan_changes(Generation(q.from), Generation(to)).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    if is_json(&headers, header::ACCEPT) {
        return Ok(Json(changes).into_response());
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], codec::encode(&changes)).into_response())
}

async fn version<S: ManagedZones>(Zoned(ctl): Zoned<S>) -> ApiResult<Json<StoreVersion>> {
    Ok(Json(ctl.store.version().await?))
}

/// The largest `PUT /v1/dnssec-keys` body: the largest record, in base64, in JSON.
const DNSSEC_KEYS_BODY_BYTES_MAX: usize = dnsplan_common::store::DNSSEC_KEYS_BYTES_MAX / 3 * 4 + 1024;

/// `GET /v1/dnssec-keys`: the zone's DNSSEC keys as its authorities share them (private keys
/// sealed), `null` when there are none.
async fn dnssec_keys<S: ManagedZones>(Zoned(ctl): Zoned<S>) -> ApiResult<Json<Option<KeysBody>>> {
    Ok(Json(ctl.store.dnssec_keys().await?.map(|r| KeysBody::new(Some(r.version), &r.bytes))))
}

/// `PUT /v1/dnssec-keys`: replaces them if still at the version the body expects.
async fn put_dnssec_keys<S: ManagedZones>(
    Zoned(ctl): Zoned<S>,
    caller: Option<Extension<Caller>>,
    body: Bytes,
) -> ApiResult<Json<KeysPut>> {
    let body: KeysBody = parse_json(&body)?;
    let put = ctl.store.put_dnssec_keys(body.version, body.bytes()?).await?;
    if let KeysPut::Written { version } = put {
        let credential = Caller::name_of(caller.as_deref());
        tracing::info!(target: AUDIT_TARGET, action = "dnssec-keys", version, credential = %credential, "the zone's shared DNSSEC keys written");
    }
    Ok(Json(put))
}

/// `GET /v1/generation-base`: the generation the store's first plan follows.
async fn generation_base<S: ManagedZones>(Zoned(ctl): Zoned<S>) -> ApiResult<Json<GenerationBase>> {
    Ok(Json(GenerationBase { generation: ctl.store.generation_base().await? }))
}

async fn wait<S: ManagedZones>(Zoned(ctl): Zoned<S>, Query(q): Query<WaitQuery>) -> ApiResult<Json<StoreVersion>> {
    let seen = StoreVersion { latest: q.latest, applied_changes: q.applied_changes, control_changes: q.control_changes };
    Ok(Json(ctl.store.wait_for_change(seen, Duration::from_millis(q.timeout_ms)).await?))
}

/// The whole active state, or with `?limit=N[&after=NAME]` one page of it.
async fn active_all<S: ManagedZones>(Zoned(ctl): Zoned<S>, Query(q): Query<ActiveQuery>) -> ApiResult<Response> {
    match q.limit {
        None if q.after.is_some() => Err(ApiError::bad_request("after= needs limit=")),
        None => Ok(Json(ctl.store.active_all().await?).into_response()),
        Some(limit) => {
            let after = q.after.as_deref().map(parse_endpoint).transpose()?;
            Ok(Json(ctl.store.active_page(after, limit).await?).into_response())
        }
    }
}

async fn active<S: ManagedZones>(Zoned(ctl): Zoned<S>, Path(EndpointParam { endpoint }): Path<EndpointParam>) -> ApiResult<Response> {
    Ok(Json(ctl.store.active(&parse_endpoint(&endpoint)?).await?).into_response())
}

async fn apply<S: ManagedZones>(
    Zoned(ctl): Zoned<S>,
    Path(EndpointParam { endpoint }): Path<EndpointParam>,
    body: Bytes,
) -> ApiResult<Response> {
    let name = parse_endpoint(&endpoint)?;
    let req: ApplyRequest = parse_json(&body)?;
    let result = ctl.store.apply(&name, req.generation, &req.records).await;
    ctl.count_apply(&result);
    Ok(Json(result?).into_response())
}

/// The batch as JSON (`application/json`) or as a codec envelope (`application/octet-stream`,
/// what `RemoteStore` sends).
async fn apply_many<S: ManagedZones>(Zoned(ctl): Zoned<S>, headers: HeaderMap, body: Bytes) -> ApiResult<Response> {
    let envelope =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/octet-stream"));
    let req: ApplyManyRequest = if envelope {
        codec::decode(&body).map_err(|e| ApiError::bad_request(format!("apply batch envelope: {e}")))?
    } else {
        parse_json(&body)?
    };
    let results = ctl.store.apply_many(req.generation, &req.items).await?;
    results.iter().for_each(|r| ctl.count_apply(r));
    let answer: ApplyManyResponse = results.into_iter().map(|r| r.map_err(|e| WireError::from(&e))).collect();
    Ok(Json(answer).into_response())
}

/// JSON, or a codec envelope with `Accept: application/octet-stream` (what `RemoteStore` asks
/// for).
async fn changes<S: ManagedZones>(Zoned(ctl): Zoned<S>, headers: HeaderMap, Query(q): Query<ChangesQuery>) -> ApiResult<Response> {
    let delta = ctl.store.active_since(q.since).await?;
    if wants_envelope(&headers) {
        return Ok(([(header::CONTENT_TYPE, "application/octet-stream")], codec::encode(&delta)).into_response());
    }
    Ok(Json(delta).into_response())
}

fn wants_envelope(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/octet-stream"))
}

async fn retire<S: ManagedZones>(
    Zoned(ctl): Zoned<S>,
    Path(EndpointParam { endpoint }): Path<EndpointParam>,
    body: Bytes,
) -> ApiResult<Response> {
    let name = parse_endpoint(&endpoint)?;
    let req: RetireRequest = parse_json(&body)?;
    Ok(Json(ctl.store.retire(&name, req.generation).await?).into_response())
}

async fn cleanup_preview<S: ManagedZones>(Zoned(ctl): Zoned<S>, Query(q): Query<CleanupRequest>) -> ApiResult<Response> {
    Ok(Json(ctl.store.cleanup_preview(q.retain).await?).into_response())
}

async fn cleanup<S: ManagedZones>(Zoned(ctl): Zoned<S>, caller: Option<Extension<Caller>>, body: Bytes) -> ApiResult<Response> {
    let req: CleanupRequest = parse_json(&body)?;
    let report = ctl.store.cleanup(req.retain).await?;
    if let Some((first, last)) = report.deleted() {
        let credential = Caller::name_of(caller.as_deref());
        tracing::info!(target: AUDIT_TARGET, action = "cleanup", first = first.0, last = last.0, credential = %credential, "cleanup deleted plans");
    }
    Ok(Json(report).into_response())
}

async fn paused<S: ManagedZones>(Zoned(ctl): Zoned<S>) -> ApiResult<Response> {
    Ok(Json(ctl.store.paused().await?).into_response())
}

async fn pause<S: ManagedZones>(Zoned(ctl): Zoned<S>, caller: Option<Extension<Caller>>, body: Bytes) -> ApiResult<StatusCode> {
    let state: PauseState = parse_json(&body)?;
    let (by, reason) = (state.by.to_string(), state.reason.clone());
    ctl.store.pause(state).await?;
    // After the store accepted it; Debug-escaped, so a newline in a reason cannot forge a line.
    let credential = Caller::name_of(caller.as_deref());
    tracing::warn!(target: AUDIT_TARGET, action = "pause", by = ?by, reason = ?reason, credential = %credential, "automation paused");
    Ok(StatusCode::NO_CONTENT)
}

async fn resume<S: ManagedZones>(Zoned(ctl): Zoned<S>, caller: Option<Extension<Caller>>) -> ApiResult<StatusCode> {
    ctl.store.resume().await?;
    let credential = Caller::name_of(caller.as_deref());
    tracing::info!(target: AUDIT_TARGET, action = "resume", credential = %credential, "automation resumed");
    Ok(StatusCode::NO_CONTENT)
}

async fn heartbeats<S: ManagedZones>(Zoned(ctl): Zoned<S>) -> ApiResult<Response> {
    Ok(Json(ctl.store.heartbeats().await?).into_response())
}

async fn heartbeat<S: ManagedZones>(Zoned(ctl): Zoned<S>, body: Bytes) -> ApiResult<StatusCode> {
    let beat: Heartbeat = parse_json(&body)?;
    ctl.store.heartbeat(beat).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn lease<S: ManagedZones>(Zoned(ctl): Zoned<S>) -> ApiResult<Response> {
    Ok(Json(ctl.store.lease().await?).into_response())
}

async fn acquire_lease<S: ManagedZones>(Zoned(ctl): Zoned<S>, body: Bytes) -> ApiResult<Response> {
    let req: AcquireLeaseRequest = parse_json(&body)?;
    let lease = ctl.store.acquire_lease(&req.holder, Duration::from_millis(req.ttl_ms)).await?;
    Ok(Json(lease).into_response())
}

async fn release_lease<S: ManagedZones>(Zoned(ctl): Zoned<S>, body: Bytes) -> ApiResult<StatusCode> {
    let lease: Lease = parse_json(&body)?;
    ctl.store.release_lease(&lease).await?;
    tracing::info!(holder = %lease.holder, epoch = lease.epoch, "planner lease released");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::token_matches;

    #[test]
    fn tokens() {
        assert!(token_matches(b"secret", b"secret"));
        assert!(!token_matches(b"secreT", b"secret"));
        assert!(!token_matches(b"secret!", b"secret"));
        assert!(!token_matches(b"", b"secret"));
    }
}
