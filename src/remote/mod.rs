//! Datasets in object storage (feature `remote`): `s3://`, `gs://`, `az://` and `http(s)://`
//! sources through Apache Arrow's `object_store` crate.
//!
//! A [`Store`] lists the objects under a URL and fetches byte ranges of them. It is not read
//! by the loader directly: every byte goes through the node cache ([`crate::cache::NodeCache`]), which
//! keeps the fetched extents on local disk, once per node, and which the I/O engine reads as it
//! reads any local file.
//!
//! Endpoint, region and credentials are read the way the AWS SDKs read them: the environment
//! (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_REGION`…), then the shared files
//! (`~/.aws/credentials`, `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE` /
//! `AWS_CONFIG_FILE`) for the profile `AWS_PROFILE` (else `default`). An `http://` endpoint is
//! allowed without a further switch, as the SDKs allow it. Google Cloud Storage and Azure read
//! their own environment (`GOOGLE_*`, `AZURE_*`) through `object_store`'s builders.
//!
//! Retries are gpufeed's, not `object_store`'s, so that they are counted: a GET that fails,
//! stalls (no answer within [`REQUEST_TIMEOUT`]) or is throttled (503 SlowDown) is retried with
//! exponential backoff until [`RETRY_WINDOW`] has passed since its first try; an object that
//! is missing, forbidden or changed (its ETag no longer matches) is not retried.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, ObjectStore, RetryConfig};

use crate::error::{invalid, Error, ErrorKind, Result};

/// The longest one request may take before it counts as stalled and is retried.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a failing GET is retried, from its first try, before the error is reported.
pub const RETRY_WINDOW: Duration = Duration::from_secs(120);
/// The longest a request waits for its next byte (the answer's head included) before it counts
/// as stalled and is retried: a server that accepts and never answers is seen in this time,
/// not after [`REQUEST_TIMEOUT`].
pub const STALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Requests retried by every store of this process.
static RETRIES: AtomicU64 = AtomicU64::new(0);

/// Requests retried so far by every store of this process (after a failure, stall or throttle).
pub fn total_retries() -> u64 {
    RETRIES.load(Ordering::Relaxed)
}

/// The first backoff; each retry doubles it, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Whether `s` names a remote source (`scheme://…` for a scheme `object_store` serves).
pub fn is_url(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once("://") else {
        return false;
    };
    !rest.is_empty()
        && matches!(
            scheme.to_ascii_lowercase().as_str(),
            "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss" | "http" | "https"
        )
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its key in the store (the bucket's path, without the bucket).
    pub key: String,
    /// Its full URL, for messages.
    pub url: String,
    /// Bytes.
    pub size: u64,
    /// The ETag the server gave (changes when the object does); fetches ask for this version.
    pub etag: Option<String>,
}

/// Counters of one [`Store`]'s traffic (this process only; the node cache counts the node's).
#[derive(Debug, Default)]
pub struct StoreStats {
    /// GET requests that returned bytes.
    pub gets: AtomicU64,
    /// Bytes those GETs returned.
    pub bytes: AtomicU64,
    /// Requests tried again after a failure, a stall or a throttle.
    pub retries: AtomicU64,
    /// Nanoseconds spent waiting on GETs, summed over the threads that waited.
    pub wait_ns: AtomicU64,
    /// When a retry was last said (a notice per store and [`RETRY_WINDOW`], not one per GET:
    /// a stalled store's parallel reads each said it).
    said: std::sync::Mutex<Option<Instant>>,
}

/// An object store and the prefix a dataset lies under.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// The URL as given, without a trailing `/`.
    url: String,
    /// The part of the URL before the object keys (`s3://bucket`).
    base: String,
    /// The prefix inside the store.
    prefix: ObjPath,
    /// The URL ended in `/`: the objects under the prefix, never an object of that name.
    prefix_only: bool,
    /// The server the URL's bucket is on, where the URL does not say it ([`Store::origin`]).
    origin: String,
    /// The limit on each wait while the dataset is being opened ([`StoreOptions::open_timeout`]),
    /// and whether it still is (every clone sees [`Store::opened`]).
    open_timeout: Option<Duration>,
    opening: Arc<std::sync::atomic::AtomicBool>,
    stats: Arc<StoreStats>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &crate::error::redact(&self.url))
            .finish()
    }
}

/// The runtime every store's requests run on: two threads (the requests are I/O; the callers
/// block on them from their own threads).
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gpufeed-remote")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| invalid(format!("cannot start the object-store runtime: {e}")))
}

/// A profile's settings from the AWS shared files: `credentials` then `config` (whose sections
/// are `[profile NAME]`, except `[default]`).
fn aws_profile() -> HashMap<String, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, name: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let profile = std::env::var("AWS_PROFILE")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "default".into());
    let mut out = HashMap::new();
    for (path, section) in [
        (
            file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            profile.clone(),
        ),
        (
            file("AWS_CONFIG_FILE", "config"),
            if profile == "default" {
                profile.clone()
            } else {
                format!("profile {profile}")
            },
        ),
    ] {
        let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
            continue;
        };
        out.extend(ini_section(&text, &section));
    }
    out
}

/// The `key = value` lines of `[section]` in an INI text (keys lower case; the first file's
/// value wins over a later one, as the SDKs read credentials before config).
fn ini_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    out
}

/// Settings for the stores datasets are opened from, over the environment's: per S3 bucket,
/// as `object_store` names them (`aws_endpoint`, `aws_access_key_id`, `aws_region`…). A value
/// (in [`OpenOptions::store`](crate::dataset::OpenOptions::store), or given to
/// [`Store::open_with`]), so that two datasets in one process may name two servers for one
/// bucket; the environment and the shared AWS files fill in what it leaves unset.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    s3: Vec<(String, Vec<(String, String)>)>,
    timeout: Option<Duration>,
}

impl StoreOptions {
    /// A limit on each wait of the open for the store (its listing, the indexes and headers it
    /// reads), retries included: a store that accepts connections and does not answer fails
    /// the open in this time (`TimedOut`) rather than after [`RETRY_WINDOW`]. The loader's
    /// `timeout` setting, given at the doors that open and load at once (Python's `Loader`,
    /// the C ABI, `bench load --timeout`). Reads once the dataset is open are not bounded by it:
    /// a sample fetched during an epoch is waited for as long as the store is retried, and the
    /// consumer's wait for its batch is what the loader's timeout bounds.
    pub fn open_timeout(mut self, limit: Option<Duration>) -> StoreOptions {
        self.timeout = limit;
        self
    }

    /// These settings for `s3://BUCKET/…` (replacing any given before for it).
    pub fn s3_bucket(mut self, bucket: &str, options: &[(&str, &str)]) -> StoreOptions {
        self.s3.retain(|(b, _)| b != bucket);
        self.s3.push((
            bucket.to_string(),
            options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        self
    }

    fn s3_of(&self, bucket: &str) -> &[(String, String)] {
        self.s3
            .iter()
            .find(|(b, _)| b == bucket)
            .map_or(&[], |(_, o)| o.as_slice())
    }
}

/// The buckets and the names set for each, not their values (a secret key stays unprinted).
impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        m.entries(
            self.s3
                .iter()
                .map(|(b, o)| (b, o.iter().map(|(k, _)| k).collect::<Vec<_>>())),
        );
        if let Some(t) = self.timeout {
            m.entry(&"open_timeout", &t);
        }
        m.finish()
    }
}

fn client_options() -> object_store::ClientOptions {
    object_store::ClientOptions::new()
        .with_timeout(REQUEST_TIMEOUT)
        .with_read_timeout(STALL_TIMEOUT)
        .with_connect_timeout(Duration::from_secs(5))
}

/// No retries inside `object_store`: [`Store`] retries, and counts.
fn no_retries() -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    }
}

/// An endpoint as an origin: scheme, host (lower case) and port, and its path if any — no
/// credentials, query or trailing `/` (`HTTP://User:pw@Host:9000/` is `http://host:9000`).
fn endpoint_origin(e: &str) -> String {
    match url::Url::parse(e) {
        Ok(u) => {
            let mut o = format!("{}://{}", u.scheme(), u.host_str().unwrap_or_default());
            if let Some(p) = u.port() {
                o.push_str(&format!(":{p}"));
            }
            o.push_str(u.path().trim_end_matches('/'));
            o
        }
        Err(_) => e.to_string(),
    }
}

/// The environment's variables whose names start with `prefix` (`AWS_`, `GOOGLE_`, `AZURE_`),
/// as `object_store`'s `from_env` reads them, except that an empty one is as if unset: an env
/// file's `AWS_ENDPOINT_URL=` means none (object_store took it for an endpoint and panicked on
/// the first request).
fn env_settings(prefix: &str) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, v)| k.starts_with(prefix) && !v.is_empty())
        .collect()
}

/// Why an S3 setting cannot be used, in words (its value named where it is no secret):
/// object_store panics on an endpoint that is not an absolute http(s) URL and on a region, key
/// id or token that cannot go into an HTTP header, at the first request.
fn check_s3_setting(
    key: &object_store::aws::AmazonS3ConfigKey,
    v: &str,
) -> std::result::Result<(), String> {
    use object_store::aws::AmazonS3ConfigKey as K;
    let control = |v: &str| v.chars().any(|c| c.is_control());
    match key {
        K::Endpoint | K::S3Endpoint | K::StsEndpoint | K::MetadataEndpoint => {
            // url::Url trims spaces and line breaks and spells a non-ASCII host in punycode;
            // object_store uses the value as given (and panicked on both).
            if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "is {v:?}: holds a space or a control character (a line break?)"
                ));
            }
            if !v.is_ascii() {
                return Err(format!(
                    "is {v:?}: holds non-ASCII characters (spell a host in punycode, xn--…)"
                ));
            }
            let u = url::Url::parse(v).map_err(|e| format!("is {v:?}, not a URL ({e})"))?;
            if !matches!(u.scheme(), "http" | "https") || !u.has_host() {
                return Err(format!(
                    "is {v:?}: an endpoint is an http:// or https:// URL with a host \
                     (http://127.0.0.1:9000, https://s3.example.com)"
                ));
            }
        }
        K::Region | K::DefaultRegion
            if !v
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) =>
        {
            return Err(format!(
                "is {v:?}: a region is a name of letters, digits and dashes (us-east-1)"
            ));
        }
        K::AccessKeyId | K::Token | K::RoleArn | K::RoleSessionName if control(v) => {
            return Err("holds a control character (a line break?)".into());
        }
        _ => {}
    }
    Ok(())
}

/// The key prefix a URL's path names: percent-decoded once (`%25` in the URL is a `%` in the key).
fn url_path(url: &str, path: &str) -> Result<ObjPath> {
    ObjPath::from_url_path(path).map_err(|e| invalid(format!("{url}: not a key prefix ({e})")))
}

fn store_error(url: &str, e: impl std::fmt::Display) -> Error {
    invalid(format!("{url}: {e}"))
}

impl Store {
    /// Opens the store a URL names: `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`, or an `http(s)://` URL (S3-style hosts are recognised as S3).
    pub fn open(url: &str) -> Result<Store> {
        Store::open_with(url, &StoreOptions::default())
    }

    /// [`open`](Self::open), with `options` over the environment's settings.
    pub fn open_with(url: &str, options: &StoreOptions) -> Result<Store> {
        let prefix_only = url.ends_with('/');
        let url = url.trim_end_matches('/').to_string();
        let parsed =
            url::Url::parse(&url).map_err(|e| invalid(format!("{url}: not a URL ({e})")))?;
        // object_store sends the key alone: a query (a presigned URL's signature) would be
        // dropped, and kept in the node cache's names had it been taken.
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid(format!(
                "{}: a query or fragment (`?…`, `#…`) in a dataset URL is not sent to the store \
                 (a presigned URL signs one GET of one object, not the listing and ranged GETs \
                 a dataset needs): name the prefix without it, with the credentials in \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or a profile (a `?` or `#` in a \
                 key is written %3F, %23)",
                // Shown without them: a fragment or query may hold anything (a token).
                crate::error::redact(&url[..url.find(['?', '#']).unwrap_or(url.len())])
            )));
        }
        let scheme = parsed.scheme().to_ascii_lowercase();
        let (inner, prefix, origin): (Arc<dyn ObjectStore>, ObjPath, String) = match scheme.as_str()
        {
            "s3" | "s3a" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
                let bucket = parsed.host_str().unwrap_or_default();
                // Each setting with where it came from (for an error that names it): the
                // store options, then the environment, then the shared files fill in what is
                // still unset.
                let mut settings: Vec<(K, String, String)> = Vec::new();
                for (k, v) in options.s3_of(bucket) {
                    let key: K = k.parse().map_err(|e| store_error(&url, e))?;
                    settings.push((key, v.clone(), format!("the store options' {k}")));
                }
                for (name, v) in env_settings("AWS_") {
                    if let Ok(key) = name.to_ascii_lowercase().parse::<K>() {
                        if !settings.iter().any(|(k, _, _)| *k == key) {
                            settings.push((key, v, name));
                        }
                    }
                }
                let profile = aws_profile();
                for (name, key) in [
                    ("aws_access_key_id", K::AccessKeyId),
                    ("aws_secret_access_key", K::SecretAccessKey),
                    ("aws_session_token", K::Token),
                    ("region", K::Region),
                    ("endpoint_url", K::Endpoint),
                ] {
                    if !settings.iter().any(|(k, _, _)| *k == key) {
                        if let Some(v) = profile.get(name).filter(|v| !v.is_empty()) {
                            settings.push((key, v.clone(), format!("the AWS profile's {name}")));
                        }
                    }
                }
                let mut b = AmazonS3Builder::new();
                for (key, v, from) in &settings {
                    check_s3_setting(key, v).map_err(|why| {
                        invalid(format!("{url}: {from} {why}; unset it or correct it"))
                    })?;
                    b = b.with_config(*key, v);
                }
                let http = [K::Endpoint, K::S3Endpoint]
                    .iter()
                    .filter_map(|k| b.get_config_value(k))
                    .any(|e| e.starts_with("http://"));
                // The server the bucket is on: the endpoint the requests go to (the S3 one
                // first, as object_store takes it), else AWS's partition of the region.
                let origin = match b
                    .get_config_value(&K::S3Endpoint)
                    .or_else(|| b.get_config_value(&K::Endpoint))
                {
                    Some(e) => endpoint_origin(&e),
                    None => {
                        let region = b.get_config_value(&K::Region).unwrap_or_default();
                        if region.starts_with("cn-") {
                            "aws-cn".to_string()
                        } else if region.starts_with("us-gov-") {
                            "aws-us-gov".to_string()
                        } else {
                            "aws".to_string()
                        }
                    }
                };
                let store = b
                    .with_url(url.as_str())
                    .with_retry(no_retries())
                    .with_client_options(client_options().with_allow_http(http))
                    .build()
                    .map_err(|e| store_error(&url, e))?;
                (Arc::new(store), url_path(&url, parsed.path())?, origin)
            }
            "gs" => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                let mut b = GoogleCloudStorageBuilder::new();
                if let Some(p) = std::env::var("SERVICE_ACCOUNT")
                    .ok()
                    .filter(|p| !p.is_empty())
                {
                    b = b.with_service_account_path(p);
                }
                for (k, v) in env_settings("GOOGLE_") {
                    if let Ok(key) = k.to_ascii_lowercase().parse::<GoogleConfigKey>() {
                        b = b.with_config(key, v);
                    }
                }
                let b = b.with_url(url.as_str());
                let origin = match b.get_config_value(&GoogleConfigKey::BaseUrl) {
                    Some(e) => endpoint_origin(&e),
                    None => "gcs".to_string(),
                };
                let store = b
                    .with_retry(no_retries())
                    .with_client_options(client_options())
                    .build()
                    .map_err(|e| store_error(&url, e))?;
                (Arc::new(store), url_path(&url, parsed.path())?, origin)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                let mut b = MicrosoftAzureBuilder::new();
                for (k, v) in env_settings("AZURE_") {
                    if let Ok(key) = k.to_ascii_lowercase().parse::<AzureConfigKey>() {
                        b = b.with_config(key, v);
                    }
                }
                if let Some(e) = std::env::var("IDENTITY_ENDPOINT")
                    .ok()
                    .filter(|e| !e.is_empty())
                {
                    b = b.with_msi_endpoint(e);
                }
                let b = b.with_url(url.as_str());
                // A container's name is the storage account's: the account is the origin (and
                // the endpoint, where one is set: an emulator).
                let account = b
                    .get_config_value(&AzureConfigKey::AccountName)
                    .unwrap_or_default();
                let origin = match b.get_config_value(&AzureConfigKey::Endpoint) {
                    Some(e) => format!("azure-{account}@{}", endpoint_origin(&e)),
                    None => format!("azure-{account}"),
                };
                let store = b
                    .with_retry(no_retries())
                    .with_client_options(client_options())
                    .build()
                    .map_err(|e| store_error(&url, e))?;
                (Arc::new(store), url_path(&url, parsed.path())?, origin)
            }
            "http" | "https" => {
                // reqwest refuses to build a request from such a URL ("builder error"), which
                // was retried for two minutes; the store has no way to send them either.
                if !parsed.username().is_empty() || parsed.password().is_some() {
                    return Err(invalid(format!(
                        "{url}: credentials in an http(s) URL (user:password@) are not sent: a \
                         plain http(s) store must be readable without them; for an S3 store \
                         use s3://BUCKET/PREFIX with the keys in AWS_ACCESS_KEY_ID and \
                         AWS_SECRET_ACCESS_KEY (or a profile) and AWS_ENDPOINT_URL"
                    )));
                }
                let (store, path) =
                    object_store::parse_url(&parsed).map_err(|e| store_error(&url, e))?;
                // The host is in the URL (and so in every object's).
                (Arc::from(store), path, "web".to_string())
            }
            other => {
                return Err(invalid(format!(
                    "{url}: the scheme {other}:// is not an object store gpufeed reads \
                     (s3, gs, az, http, https)"
                )))
            }
        };
        let base = match scheme.as_str() {
            "http" | "https" => url[..url.len() - parsed.path().len()].to_string(),
            _ => format!("{}://{}", scheme, parsed.host_str().unwrap_or_default()),
        };
        Ok(Store {
            inner,
            url,
            base,
            prefix,
            prefix_only,
            origin,
            open_timeout: options.timeout,
            opening: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            stats: Arc::default(),
        })
    }

    /// The dataset over this store is open: its waits are no longer bounded by the open's
    /// timeout ([`StoreOptions::open_timeout`]).
    pub(crate) fn opened(&self) {
        self.opening.store(false, Ordering::Relaxed);
    }

    /// The limit on this wait, if the open's timeout applies to it.
    fn wait_limit(&self) -> Option<Duration> {
        self.open_timeout
            .filter(|_| self.opening.load(Ordering::Relaxed))
    }

    /// Runs `fut` on the runtime, for at most [`wait_limit`](Self::wait_limit): a try that
    /// passes it is a stall (retried within the same limit).
    fn block_on<T>(
        &self,
        rt: &tokio::runtime::Runtime,
        fut: impl std::future::Future<Output = std::result::Result<T, object_store::Error>>,
    ) -> std::result::Result<T, object_store::Error> {
        match self.wait_limit() {
            None => rt.block_on(fut),
            Some(limit) => rt.block_on(async {
                tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
                    Err(object_store::Error::Generic {
                        store: "gpufeed",
                        source: format!("no answer in {:.1} s", limit.as_secs_f64()).into(),
                    })
                })
            }),
        }
    }

    /// The server the URL's bucket is on, where the URL does not name it: an S3 store's
    /// endpoint (`http://127.0.0.1:8333`, without credentials or a trailing `/`) or AWS's
    /// partition (`aws`), an Azure container's account, `gcs`, `web` (an http(s) URL names its
    /// host). Part of what an object is: two servers' `s3://bucket/key` are two objects.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether the URL ended in `/` (it names the objects under the prefix, not an object).
    pub fn is_prefix(&self) -> bool {
        self.prefix_only
    }

    /// The URL as given (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// This process's traffic with the store.
    pub fn stats(&self) -> &Arc<StoreStats> {
        &self.stats
    }

    /// The URL of an object.
    pub fn object_url(&self, key: &str) -> String {
        format!("{}/{}", self.base, key)
    }

    /// Every object under the URL's prefix (the prefix itself when it names one object), sorted
    /// by key.
    pub fn list(&self) -> Result<Vec<ObjectInfo>> {
        use futures_util::TryStreamExt;
        let rt = runtime()?;
        let info = |m: object_store::ObjectMeta| ObjectInfo {
            url: self.object_url(m.location.as_ref()),
            key: m.location.to_string(),
            size: m.size,
            etag: m.e_tag,
        };
        // A prefix that is itself an object: that one object (unless the URL ended in `/`).
        if !self.prefix.as_ref().is_empty() && !self.prefix_only {
            use object_store::ObjectStoreExt;
            match self.retrying("HEAD", &self.url, || {
                self.block_on(rt, self.inner.head(&self.prefix))
            }) {
                Ok(m) => return Ok(vec![info(m)]),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        // A listing of 10⁵ objects is a hundred pages: said as it goes after 2 s.
        let mut task = crate::progress::Task::items_after(
            format!("listing {}", self.url),
            0,
            "objects",
            Duration::from_secs(2),
        );
        let mut all: Vec<ObjectInfo> = self
            .retrying("LIST", &self.url, || {
                let task = &mut task;
                self.block_on(rt, async move {
                    let mut got = Vec::new();
                    let mut pages = self.inner.list(prefix);
                    while let Some(m) = pages.try_next().await? {
                        got.push(m);
                        task.set(got.len() as u64);
                    }
                    Ok(got)
                })
            })?
            .into_iter()
            .map(info)
            .collect();
        task.finish();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(all)
    }

    /// What the store holds now as `object` (`None`: nothing): one HEAD, asked when a read of
    /// it failed, to tell a replaced object from a damaged one.
    pub(crate) fn now(&self, object: &ObjectInfo) -> Result<Option<ObjectInfo>> {
        use object_store::ObjectStoreExt;
        let rt = runtime()?;
        let location =
            ObjPath::parse(&object.key).map_err(|e| invalid(format!("{}: {e}", object.url)))?;
        match self.retrying("HEAD", &object.url, || {
            self.block_on(rt, self.inner.head(&location))
        }) {
            Ok(m) => Ok(Some(ObjectInfo {
                url: object.url.clone(),
                key: object.key.clone(),
                size: m.size,
                etag: m.e_tag,
            })),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The bytes `range` of `object`, as long as it is still the version listed (its ETag, when
    /// the server gave one): an object that changed since is an error, not mixed bytes.
    pub fn get(&self, object: &ObjectInfo, range: Range<u64>) -> Result<Vec<u8>> {
        let mut v = vec![0u8; (range.end - range.start) as usize];
        self.get_into(object, range.start, &mut v)?;
        Ok(v)
    }

    /// Fetches `dst.len()` bytes of `object` from `offset` straight into `dst` (the body's
    /// chunks are copied in as they arrive: no buffer of the whole answer), as long as it is
    /// still the version listed.
    pub fn get_into(&self, object: &ObjectInfo, offset: u64, dst: &mut [u8]) -> Result<()> {
        use futures_util::StreamExt;
        let rt = runtime()?;
        let t0 = Instant::now();
        // The key as listed, as it is: `from` would escape a `%` in it a second time.
        let location = ObjPath::parse(&object.key).map_err(|e| {
            invalid(format!(
                "{}: not a key this store can fetch ({e})",
                object.url
            ))
        })?;
        let range = offset..offset + dst.len() as u64;
        let what = format!("GET bytes {}..{}", range.start, range.end);
        let got = self.retrying(&what, &object.url, || {
            self.block_on(rt, async {
                let opts = GetOptions {
                    if_match: object.etag.clone(),
                    range: Some(GetRange::Bounded(range.clone())),
                    ..GetOptions::default()
                };
                let r = self.inner.get_opts(&location, opts).await?;
                // Not every server honours If-Match on a ranged GET: the answer's ETag decides.
                if let (Some(want), Some(got)) = (&object.etag, &r.meta.e_tag) {
                    if want != got {
                        return Err(object_store::Error::Precondition {
                            path: object.key.clone(),
                            source: format!("ETag {got}, listed as {want}").into(),
                        });
                    }
                }
                let mut at = 0usize;
                let mut body = r.into_stream();
                while let Some(chunk) = body.next().await {
                    let chunk = chunk?;
                    // A server that sends more than asked is cut off, and caught below.
                    let n = chunk.len().min(dst.len() - at);
                    dst[at..at + n].copy_from_slice(&chunk[..n]);
                    at += n;
                    if n < chunk.len() {
                        at = dst.len() + 1;
                        break;
                    }
                }
                Ok(at)
            })
        })?;
        self.stats
            .wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if got != dst.len() {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                format!(
                    "{}: asked for bytes {}..{} and got {} (did the object change size?)",
                    object.url,
                    range.start,
                    range.end,
                    if got > dst.len() {
                        "more".to_string()
                    } else {
                        format!("{got} bytes")
                    }
                ),
            ));
        }
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Uploads `bytes` as `key` under the URL's prefix (the tests and `bench remote` put their
    /// datasets on the server this way).
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        use object_store::ObjectStoreExt;
        let rt = runtime()?;
        let full = if self.prefix.as_ref().is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix.as_ref())
        };
        let location = ObjPath::parse(&full)
            .map_err(|e| invalid(format!("{}: {e}", self.object_url(&full))))?;
        let url = self.object_url(location.as_ref());
        let payload = object_store::PutPayload::from(bytes);
        self.retrying("PUT", &url, || {
            rt.block_on(self.inner.put(&location, payload.clone()))
        })
        .map(|_| ())
    }

    /// Uploads `bytes` as the object `key` of the store (a whole key, not under the URL's
    /// prefix): `gpufeed index` puts a tar's index beside it this way.
    pub fn put_key(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        use object_store::ObjectStoreExt;
        let rt = runtime()?;
        let location =
            ObjPath::parse(key).map_err(|e| invalid(format!("{}: {e}", self.object_url(key))))?;
        let url = self.object_url(key);
        let payload = object_store::PutPayload::from(bytes);
        self.retrying("PUT", &url, || {
            rt.block_on(self.inner.put(&location, payload.clone()))
        })
        .map(|_| ())
    }

    /// The store's bucket on its server, as [`answered`] knows it.
    fn server(&self) -> String {
        format!("{} {}", self.origin, self.base)
    }

    /// Runs `op` until it succeeds, fails for good, or its retry window has passed: a request
    /// the server answered with a permanent error (not found, forbidden, a bad request) fails
    /// at once; one that could not connect to a store that never answered this process fails
    /// after [`FIRST_CONTACT_WINDOW`] (a wrong endpoint, a closed port, a name that does not
    /// resolve); anything else — a store that answered before and stopped, a stall, a throttle,
    /// a 5xx — is retried for [`RETRY_WINDOW`], said once.
    fn retrying<T>(
        &self,
        what: &str,
        url: &str,
        mut op: impl FnMut() -> std::result::Result<T, object_store::Error>,
    ) -> Result<T> {
        let t0 = Instant::now();
        let mut backoff = BACKOFF_FIRST;
        let mut tries = 0u32;
        let mut said = false;
        loop {
            tries += 1;
            // A panic inside object_store (a setting it failed to check, a server's answer it
            // did not expect) is this request's error, never the caller's crash: no panic
            // crosses a door (the CLI exited 101, Python raised PanicException).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut op))
                .unwrap_or_else(|p| Err(panicked(p)));
            let e = match r {
                Ok(v) => {
                    answered()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(self.server());
                    return Ok(v);
                }
                Err(e) => e,
            };
            let class = classify(&e);
            let window = match &class {
                Failure::Permanent(kind, why) => {
                    answered()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(self.server());
                    return Err(Error::new(*kind, format!("{url}: {what}: {why}")));
                }
                Failure::Connect(_)
                    if !answered()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains(&self.server()) =>
                {
                    FIRST_CONTACT_WINDOW
                }
                _ => RETRY_WINDOW,
            };
            // The open's timeout, where it applies, bounds every window.
            let limit = self.wait_limit();
            let window = limit.map_or(window, |l| window.min(l));
            let why = match &class {
                Failure::Connect(why) => why.clone(),
                _ => e.to_string(),
            };
            if t0.elapsed() + backoff > window {
                let hint = if window == FIRST_CONTACT_WINDOW {
                    UNANSWERED_HINT
                } else {
                    ""
                };
                if limit == Some(window) && !matches!(class, Failure::Connect(_)) {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        format!(
                            "{url}: {what}: no answer within the timeout ({:.1} s; {tries} \
                             tries): {why}",
                            window.as_secs_f64()
                        ),
                    ));
                }
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{url}: {what} failed {tries} times over {:.0} s: {why}{hint}",
                        t0.elapsed().as_secs_f64()
                    ),
                ));
            }
            // Said once a try stalled or three failed (a store that accepts and never answers
            // stalls for STALL_TIMEOUT a try: silent for two minutes before).
            if window == RETRY_WINDOW
                && !said
                && (tries >= 3 || t0.elapsed() >= Duration::from_secs(5))
            {
                said = true;
                let first = {
                    let mut last = self.stats.said.lock().unwrap_or_else(|p| p.into_inner());
                    let recent = last.is_some_and(|t| t.elapsed() < RETRY_WINDOW);
                    if !recent {
                        *last = Some(Instant::now());
                    }
                    !recent
                };
                if first {
                    crate::util::notice(&format!(
                        "{url}: {what}: {why}; retrying for up to {} s",
                        RETRY_WINDOW.as_secs()
                    ));
                }
            }
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            RETRIES.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

/// A panic's payload as object_store's error (permanent: the same request panics again).
fn panicked(p: Box<dyn std::any::Any + Send>) -> object_store::Error {
    let why = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into());
    object_store::Error::NotSupported {
        source: format!(
            "the object-store client failed on this request ({why}); check the store's \
             settings (AWS_*, GOOGLE_*, AZURE_* and the profile)"
        )
        .into(),
    }
}

/// How long a store that has not answered this process yet is tried when no connection can be
/// made: a wrong endpoint or a closed port fails in seconds, not after [`RETRY_WINDOW`].
pub const FIRST_CONTACT_WINDOW: Duration = Duration::from_secs(3);

/// The stores (by their base URL) that have answered a request of this process.
fn answered() -> &'static std::sync::Mutex<std::collections::HashSet<String>> {
    static A: OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    A.get_or_init(Default::default)
}

/// Said of a store that has not answered this process: the endpoint may be wrong.
pub(crate) const UNANSWERED_HINT: &str = " (nothing has answered there yet in this process: is \
     the endpoint right — AWS_ENDPOINT_URL or the profile's endpoint_url?)";

/// What a failed request calls for.
enum Failure {
    /// The server answered, and trying again cannot help: the kind and why, in words.
    Permanent(ErrorKind, String),
    /// No connection could be made: why, in words ("connection refused").
    Connect(String),
    /// Anything else (a stall, a throttle, a 5xx, a connection cut): tried again.
    Transient,
}

/// Sorts `e` by what it calls for, reading its chain of causes (`object_store` keeps the HTTP
/// status inside a private type: it is read from the chain's text).
fn classify(e: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => return Failure::Permanent(ErrorKind::NotFound, e.to_string()),
        E::Precondition { .. } => {
            return Failure::Permanent(
                ErrorKind::Io,
                "the object changed since it was listed (its ETag differs); reopen the dataset"
                    .into(),
            )
        }
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            return Failure::Permanent(ErrorKind::PermissionDenied, e.to_string())
        }
        // A listed key object_store will not take (a control character, an empty `//`
        // segment) fails the whole listing: said as such.
        E::InvalidPath { .. } => {
            return Failure::Permanent(
                ErrorKind::InvalidInput,
                format!(
                    "{e} — the store holds an object whose key cannot be read through \
                     object_store (a control character, or an empty segment `//`); rename it, \
                     or name the dataset's other objects one by one"
                ),
            )
        }
        E::NotSupported { .. } | E::NotImplemented { .. } => {
            return Failure::Permanent(ErrorKind::InvalidInput, e.to_string())
        }
        _ => {}
    }
    let mut text = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut connect = false;
    let mut refused = false;
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<object_store::client::HttpError>() {
            connect |= matches!(h.kind(), object_store::client::HttpErrorKind::Connect);
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        text.push_str(&format!("{c:?}\n{c}\n"));
        cur = c.source();
    }
    // S3's error codes, and the status of a bare answer.
    for (code, kind, why) in [
        (
            "NoSuchBucket",
            ErrorKind::NotFound,
            "the bucket does not exist (NoSuchBucket)",
        ),
        (
            "NoSuchKey",
            ErrorKind::NotFound,
            "no such object (NoSuchKey)",
        ),
        (
            "AccessDenied",
            ErrorKind::PermissionDenied,
            "access denied (AccessDenied)",
        ),
        (
            "InvalidAccessKeyId",
            ErrorKind::PermissionDenied,
            "the access key is not known to the server (InvalidAccessKeyId)",
        ),
        (
            "SignatureDoesNotMatch",
            ErrorKind::PermissionDenied,
            "the secret key does not match the access key (SignatureDoesNotMatch)",
        ),
        (
            "InvalidBucketName",
            ErrorKind::InvalidInput,
            "not a valid bucket name (InvalidBucketName)",
        ),
    ] {
        if text.contains(&format!("<Code>{code}</Code>")) {
            return Failure::Permanent(kind, why.into());
        }
    }
    for (status, kind) in [
        ("404", ErrorKind::NotFound),
        ("403", ErrorKind::PermissionDenied),
        ("401", ErrorKind::PermissionDenied),
        ("400", ErrorKind::InvalidInput),
    ] {
        if text.contains(&format!("status: {status}")) || text.contains(&format!("status {status}"))
        {
            return Failure::Permanent(kind, e.to_string());
        }
    }
    // A request that could not even be made (reqwest's "builder error": a URL it will not
    // send) fails the same way every time.
    if text.contains("builder error") {
        return Failure::Permanent(ErrorKind::InvalidInput, e.to_string());
    }
    if connect {
        let why = if refused {
            "connection refused".to_string()
        } else if text.contains("dns error") || text.contains("failed to lookup") {
            "the host name does not resolve (DNS)".to_string()
        } else {
            format!("cannot connect ({e})")
        };
        return Failure::Connect(why);
    }
    Failure::Transient
}

/// A SeaweedFS server for the tests, the soak and the benchmarks (`gpufeed::testing::s3`).
#[cfg(any(test, feature = "sim"))]
pub(crate) mod weed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_profiles() {
        assert!(is_url("s3://bucket/prefix"));
        assert!(is_url("HTTPS://host/x"));
        assert!(!is_url("s3://"));
        assert!(!is_url("/data/train"));
        assert!(!is_url("file://x"));
        let text = "[default]\nregion = eu-west-1\n\n[profile dev]\n# note\nregion=us-east-2\n\
                    endpoint_url = http://127.0.0.1:8333\n";
        assert_eq!(
            ini_section(text, "default"),
            vec![("region".into(), "eu-west-1".into())]
        );
        assert_eq!(
            ini_section(text, "profile dev"),
            vec![
                ("region".into(), "us-east-2".into()),
                ("endpoint_url".into(), "http://127.0.0.1:8333".into())
            ]
        );
    }
}
