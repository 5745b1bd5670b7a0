//! The emulators the suite runs against: `kinesis-local` ([`Kinesis`]) and
//! `dynalite` ([`Dynalite`]), npm packages pinned in `tests/emulators`,
//! each started as a node process on free loopback ports, waited for until
//! it answers, and killed on drop. They fail loudly, with the emulator's
//! own output, when they cannot start: tests never skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, StreamStatus};

use crate::{free_port, repo_root, run_checked};

/// Installs the npm emulators (once per process) and returns their folder.
pub fn emulators_dir() -> anyhow::Result<PathBuf> {
    static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let dir = repo_root().join("tests/emulators");
            let ready = dir.join("node_modules/kinesis-local/main.js").exists()
                && dir.join("node_modules/dynalite/cli.js").exists();
            if !ready {
                eprintln!("installing the pinned emulators (npm ci in tests/emulators, once)");
                run_checked(
                    Command::new("npm")
                        .args(["ci", "--no-audit", "--no-fund"])
                        .current_dir(&dir),
                    "installing the emulators with npm ci",
                )
                .map_err(|e| format!("{e:#}"))?;
            }
            Ok(dir)
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// A node emulator process logging to a temporary file, killed on drop.
struct EmulatorProcess {
    name: &'static str,
    child: Child,
    endpoint: String,
    log: PathBuf,
}

impl EmulatorProcess {
    /// Starts `name` from `command(port)` on a free `port` and waits until
    /// `probe(endpoint)` answers; fails loudly, with the emulator's output,
    /// when it exits or does not answer.
    ///
    /// A free port is only free when it is picked: another process (an
    /// outgoing connection's ephemeral port, say) may take it before the
    /// emulator binds it. An emulator that finds its port taken after all
    /// (`EADDRINUSE`) is started again on new ports, up to three times;
    /// any other failure fails at once.
    async fn start<P, Fut>(
        name: &'static str,
        command: impl Fn(u16) -> anyhow::Result<Command>,
        probe: impl Fn(&str) -> P,
    ) -> anyhow::Result<Self>
    where
        P: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut attempt = 1;
        loop {
            let port = free_port();
            let mut process = Self::spawn(name, command(port)?, port)?;
            let answers = probe(&process.endpoint);
            match process.wait_until(answers).await {
                Ok(()) => return Ok(process),
                Err(e) if attempt < 3 && format!("{e:#}").contains("EADDRINUSE") => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Spawns `command` (its output to a log file) for an emulator that will
    /// listen on `port`.
    fn spawn(name: &'static str, mut command: Command, port: u16) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!("{name}-{port}.log"));
        let log_file = std::fs::File::create(&log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot start {name} with node (is Node.js installed?)"))?;
        Ok(Self {
            name,
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        })
    }

    /// Polls `answers` until it succeeds; fails loudly, with the emulator's
    /// output, when the process exits or 60 s pass.
    async fn wait_until<F, Fut>(&mut self, answers: F) -> anyhow::Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited at start-up ({status}):\n{}",
                    self.name,
                    self.output()
                );
            }
            if answers().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer on {} within 60 s:\n{}",
                    self.name,
                    self.endpoint,
                    self.output()
                );
            }
            // Polling for the port to answer; start-up takes about a second.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A running `kinesis-local` emulator, killed on drop.
pub struct Kinesis {
    process: EmulatorProcess,
}

impl Kinesis {
    /// Starts the emulator on a free port and waits until it answers.
    ///
    /// # Errors
    /// When npm, node or the emulator cannot start, with its output.
    pub async fn start() -> anyhow::Result<Self> {
        let command = |port: u16| -> anyhow::Result<Command> {
            let mut command = Command::new("node");
            command
                .arg("main.js")
                .current_dir(emulators_dir()?.join("node_modules/kinesis-local"))
                .env("KINESIS_MOCK_PLAIN_PORT", port.to_string())
                .env("KINESIS_MOCK_TLS_PORT", free_port().to_string())
                .env("LOG_LEVEL", "WARN")
                // Streams become ACTIVE quickly: tests create many.
                .env("CREATE_STREAM_DURATION", "100ms")
                .env("DELETE_STREAM_DURATION", "100ms")
                .env("SPLIT_SHARD_DURATION", "100ms")
                .env("MERGE_SHARDS_DURATION", "100ms")
                .env("SHARD_LIMIT", "1100");
            Ok(command)
        };
        let probe = |endpoint: &str| {
            let client = kinesis_client(endpoint);
            move || {
                let client = client.clone();
                async move { client.list_streams().send().await.is_ok() }
            }
        };
        Ok(Self {
            process: EmulatorProcess::start("kinesis-local", command, probe).await?,
        })
    }

    /// What the emulator printed so far.
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// Its plain-HTTP endpoint, for `AWS_ENDPOINT_URL_KINESIS`.
    pub fn endpoint(&self) -> &str {
        &self.process.endpoint
    }

    /// An SDK client for it, with static test credentials.
    pub fn client(&self) -> Client {
        kinesis_client(self.endpoint())
    }

    /// Creates a stream and waits until it is ACTIVE.
    ///
    /// # Errors
    /// When the emulator refuses or the stream never becomes active.
    pub async fn create_stream(&self, name: &str, shards: i32) -> anyhow::Result<()> {
        let client = self.client();
        client
            .create_stream()
            .stream_name(name)
            .shard_count(shards)
            .send()
            .await
            .with_context(|| format!("CreateStream {name}"))?;
        self.wait_active(name).await
    }

    /// A stream's ARN (DescribeStreamSummary).
    ///
    /// # Errors
    /// When the call fails.
    pub async fn stream_arn(&self, name: &str) -> anyhow::Result<String> {
        let summary = self
            .client()
            .describe_stream_summary()
            .stream_name(name)
            .send()
            .await?;
        Ok(summary
            .stream_description_summary()
            .context("DescribeStreamSummary without a summary")?
            .stream_arn()
            .to_owned())
    }

    /// Waits until a stream is ACTIVE (after create, split or merge).
    ///
    /// # Errors
    /// When it is not within 30 s.
    pub async fn wait_active(&self, name: &str) -> anyhow::Result<()> {
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let summary = client
                .describe_stream_summary()
                .stream_name(name)
                .send()
                .await?;
            if summary
                .stream_description_summary()
                .is_some_and(|s| s.stream_status() == &StreamStatus::Active)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("stream {name} not ACTIVE within 30 s");
            }
            // Polling the stream's status; the emulator flips it after
            // CREATE_STREAM_DURATION.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Puts records (partition key, data) in order, in PutRecords calls of
    /// up to 500, and returns each record's (shard id, sequence number).
    /// Records that Kinesis refuses are put again, keeping the order of
    /// each key.
    ///
    /// # Errors
    /// When a call fails.
    pub async fn put_records(
        &self,
        stream: &str,
        records: &[(String, Vec<u8>)],
    ) -> anyhow::Result<Vec<(String, String)>> {
        let client = self.client();
        let mut out = Vec::with_capacity(records.len());
        for chunk in records.chunks(500) {
            // One record at a time when a batch partly fails, so per-key
            // order is never broken by a partial retry.
            let entries: Vec<_> = chunk
                .iter()
                .map(|(key, data)| {
                    PutRecordsRequestEntry::builder()
                        .partition_key(key)
                        .data(Blob::new(data.clone()))
                        .build()
                        .expect("key and data are set")
                })
                .collect();
            let result = client
                .put_records()
                .stream_name(stream)
                .set_records(Some(entries))
                .send()
                .await
                .context("PutRecords")?;
            if result.failed_record_count().unwrap_or(0) > 0 {
                bail!(
                    "PutRecords refused {:?} records",
                    result.failed_record_count()
                );
            }
            for r in result.records() {
                out.push((
                    r.shard_id().unwrap_or_default().to_owned(),
                    r.sequence_number().unwrap_or_default().to_owned(),
                ));
            }
        }
        Ok(out)
    }
}

impl Kinesis {
    /// Every record in a stream, all shards from their start: (partition
    /// key, data).
    ///
    /// # Errors
    /// When a call fails.
    pub async fn read_all(&self, stream: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let client = self.client();
        let shards = client.list_shards().stream_name(stream).send().await?;
        let mut out = Vec::new();
        for shard in shards.shards() {
            let mut iterator = client
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(shard.shard_id())
                .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
                .send()
                .await?
                .shard_iterator()
                .map(str::to_owned);
            while let Some(it) = iterator.take() {
                let page = client.get_records().shard_iterator(it).send().await?;
                for r in page.records() {
                    out.push((
                        r.partition_key().unwrap_or_default().to_owned(),
                        r.data().as_ref().to_vec(),
                    ));
                }
                if page.records().is_empty() {
                    break;
                }
                iterator = page.next_shard_iterator().map(str::to_owned);
            }
        }
        Ok(out)
    }
}

/// A running `dynalite` (DynamoDB emulator), in memory, killed on drop.
pub struct Dynalite {
    process: EmulatorProcess,
}

impl Dynalite {
    /// Starts dynalite on a free port and waits until it answers.
    ///
    /// # Errors
    /// When it cannot start, with its output.
    pub async fn start() -> anyhow::Result<Self> {
        let command = |port: u16| -> anyhow::Result<Command> {
            let mut command = Command::new("node");
            command
                .arg(emulators_dir()?.join("node_modules/dynalite/cli.js"))
                .args(["--port", &port.to_string()])
                // Tables become ACTIVE quickly: tests create them at start-up.
                .args([
                    "--createTableMs",
                    "50",
                    "--deleteTableMs",
                    "50",
                    "--updateTableMs",
                    "50",
                ]);
            Ok(command)
        };
        let probe = |endpoint: &str| {
            let client = dynamodb_client(endpoint);
            move || {
                let client = client.clone();
                async move { client.list_tables().send().await.is_ok() }
            }
        };
        Ok(Self {
            process: EmulatorProcess::start("dynalite", command, probe).await?,
        })
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// Its endpoint, for `AWS_ENDPOINT_URL_DYNAMODB`.
    pub fn endpoint(&self) -> &str {
        &self.process.endpoint
    }

    /// An SDK client for it.
    pub fn client(&self) -> aws_sdk_dynamodb::Client {
        dynamodb_client(self.endpoint())
    }
}

/// A Kinesis client for the emulator at `endpoint`.
fn kinesis_client(endpoint: &str) -> Client {
    let config = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "shardlane-testkit",
        ))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

/// A DynamoDB client for the emulator at `endpoint`.
fn dynamodb_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test",
            "test",
            None,
            None,
            "shardlane-testkit",
        ))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// Whether an HTTP server answers `GET path` at `authority` with `status`.
async fn answers(authority: &str, path: &str, status: u16) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(authority).await else {
        return false;
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.is_ok()
        && head.starts_with(b"HTTP/1.")
        && head[9..12] == *status.to_string().as_bytes()
}

/// moto in server mode (from the tools venv), serving S3 on loopback.
pub struct S3Emulator {
    process: EmulatorProcess,
}

impl S3Emulator {
    /// Starts moto's server on a free port and waits until it answers.
    ///
    /// # Errors
    /// When the tools venv cannot be made or moto cannot start, with its
    /// output.
    pub async fn start() -> anyhow::Result<Self> {
        let python = crate::tools_python()?;
        let command = |port: u16| -> anyhow::Result<Command> {
            let mut command = Command::new(&python);
            command.args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ]);
            Ok(command)
        };
        let probe = |endpoint: &str| {
            let authority = endpoint.trim_start_matches("http://").to_owned();
            move || {
                let authority = authority.clone();
                async move { answers(&authority, "/moto-api/", 200).await }
            }
        };
        Ok(Self {
            process: EmulatorProcess::start("moto-s3", command, probe).await?,
        })
    }

    /// Its endpoint, for `AWS_ENDPOINT_URL_S3`.
    pub fn endpoint(&self) -> &str {
        &self.process.endpoint
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// An SDK client for it (path-style, static test credentials).
    pub fn client(&self) -> aws_sdk_s3::Client {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                "test",
                "test",
                None,
                None,
                "shardlane-testkit",
            ))
            .endpoint_url(self.endpoint())
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    /// Creates `bucket`.
    ///
    /// # Errors
    /// When the emulator refuses.
    pub async fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        self.client().create_bucket().bucket(bucket).send().await?;
        Ok(())
    }

    /// Writes `bytes` under `key` in `bucket` (to replace a blob).
    ///
    /// # Errors
    /// When the emulator refuses.
    pub async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
        self.client()
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(bytes.into())
            .send()
            .await?;
        Ok(())
    }
}

/// Debian's `docker-registry` (the CNCF distribution registry), serving an
/// OCI registry on loopback over plain HTTP, its blobs in a temporary
/// folder.
pub struct Registry {
    process: EmulatorProcess,
    root: tempfile::TempDir,
}

impl Registry {
    /// Starts the registry on a free port and waits until `/v2/` answers.
    ///
    /// # Errors
    /// When `docker-registry` is missing (`tests/run.sh` installs it) or
    /// cannot start, with its output.
    pub async fn start() -> anyhow::Result<Self> {
        let root = tempfile::tempdir()?;
        let data = root.path().join("data");
        let config_dir = root.path().to_owned();
        let command = move |port: u16| -> anyhow::Result<Command> {
            let config = config_dir.join(format!("config-{port}.yml"));
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                    data.display()
                ),
            )?;
            let mut command = Command::new("docker-registry");
            command.arg("serve").arg(config);
            Ok(command)
        };
        let probe = |endpoint: &str| {
            let authority = endpoint.trim_start_matches("http://").to_owned();
            move || {
                let authority = authority.clone();
                async move { answers(&authority, "/v2/", 200).await }
            }
        };
        let process = EmulatorProcess::start("docker-registry", command, probe)
            .await
            .context("the OCI registry (Debian's docker-registry; tests/run.sh installs it)")?;
        Ok(Self { process, root })
    }

    /// `host:port`, for an `oci+http://` location.
    pub fn authority(&self) -> &str {
        self.process.endpoint.trim_start_matches("http://")
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// Where the registry keeps the blob of `hex` (a sha256 digest's hex
    /// digits), to replace it behind the registry's back.
    pub fn blob_path(&self, hex: &str) -> PathBuf {
        self.root
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}
