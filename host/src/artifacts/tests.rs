use std::time::Duration;

use super::*;

fn store(backend: impl Backend, transfer: Duration) -> ArtifactStore {
    ArtifactStore {
        backend: Box::new(backend),
        timeouts: ArtifactTimeouts {
            transfer,
            ..ArtifactTimeouts::default()
        },
    }
}

/// Catches: a folder store that hands out bytes that are not the version
/// asked for (replaced on disk), that reports a missing version as a
/// failure to reach the store, or that keeps a wrong file under a
/// version's name when the version is stored (every later fetch of it
/// would fail for ever).
#[tokio::test]
async fn a_folder_store_trusts_bytes_not_names() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("artifacts");
    let s = store(folder::Folder::new(folder.clone()), Duration::from_secs(5));
    let digest = s.publish(b"component bytes".to_vec()).await.unwrap();
    assert_eq!(digest, PluginDigest::of(b"component bytes"));
    assert_eq!(s.fetch(&digest).await.unwrap(), b"component bytes");
    // The same bytes again change nothing.
    assert_eq!(
        s.publish(b"component bytes".to_vec()).await.unwrap(),
        digest
    );

    // A wrong file under the right name: never served...
    std::fs::write(folder.join(file_name(&digest)), b"other").unwrap();
    assert!(matches!(
        s.fetch(&digest).await,
        Err(ArtifactError::WrongDigest { found, .. }) if found == PluginDigest::of(b"other")
    ));
    // ...and replaced by the next store of the version.
    assert_eq!(
        s.publish(b"component bytes".to_vec()).await.unwrap(),
        digest
    );
    assert_eq!(s.fetch(&digest).await.unwrap(), b"component bytes");

    assert!(matches!(
        s.fetch(&PluginDigest::of(b"never stored")).await,
        Err(ArtifactError::Missing { .. })
    ));
}

/// A store that accepts a call and never answers (a hung registry).
struct Hung;

#[async_trait]
impl Backend for Hung {
    async fn store(&self, _: &PluginDigest, _: Vec<u8>) -> Result<(), ArtifactError> {
        std::future::pending().await
    }

    async fn fetch(&self, _: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        std::future::pending().await
    }

    fn location(&self) -> String {
        "hung".into()
    }
}

/// Catches: a store call that waits for ever on a store that never
/// answers (the instance would handle nothing and ignore SIGTERM).
#[tokio::test(start_paused = true)]
async fn every_call_ends_within_the_transfer_timeout() {
    let s = store(Hung, Duration::from_secs(7));
    let started = tokio::time::Instant::now();
    assert!(matches!(
        s.fetch(&PluginDigest::of(b"x")).await,
        Err(ArtifactError::TimedOut { deadline, .. })
            if deadline.after == Duration::from_secs(7) && deadline.key == "transfer_timeout"
    ));
    assert!(matches!(
        s.publish(b"x".to_vec()).await,
        Err(ArtifactError::TimedOut { .. })
    ));
    assert_eq!(started.elapsed(), Duration::from_secs(14));
}

/// A store that keeps what it is given but hands back other bytes (a
/// bucket whose objects are rewritten by something else).
struct Rewrites;

#[async_trait]
impl Backend for Rewrites {
    async fn store(&self, _: &PluginDigest, _: Vec<u8>) -> Result<(), ArtifactError> {
        Ok(())
    }

    async fn fetch(&self, _: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        Ok(b"something else".to_vec())
    }

    fn location(&self) -> String {
        "rewrites".into()
    }
}

/// Catches: a publish that trusts the store's "stored" and lets a version
/// be recorded whose bytes cannot be fetched back.
#[tokio::test]
async fn a_publish_reads_the_bytes_back_before_anything_is_recorded() {
    let s = store(Rewrites, Duration::from_secs(5));
    assert!(matches!(
        s.publish(b"v2".to_vec()).await,
        Err(ArtifactError::WrongDigest { .. })
    ));
}

/// Catches: the memory store losing the newest versions, or growing
/// without bound.
#[tokio::test]
async fn the_memory_store_keeps_the_latest_versions() {
    let s = store(memory::Memory::default(), Duration::from_secs(5));
    let digests: Vec<PluginDigest> = {
        let mut v = Vec::new();
        for i in 0..20u8 {
            v.push(s.publish(vec![i; 10]).await.unwrap());
        }
        v
    };
    assert!(matches!(
        s.fetch(&digests[0]).await,
        Err(ArtifactError::Missing { .. })
    ));
    assert_eq!(s.fetch(&digests[19]).await.unwrap(), vec![19; 10]);
    assert_eq!(s.fetch(&digests[4]).await.unwrap(), vec![4; 10]);
}

#[test]
fn the_file_store_keeps_its_versions_beside_it() {
    assert_eq!(
        beside_lease_file(std::path::Path::new("/var/lib/shardlane/leases.redb")),
        PathBuf::from("/var/lib/shardlane/leases.redb.artifacts")
    );
}

/// Catches: a registry that accepts connections and never answers ending
/// a call with the HTTP client's own "operation timed out" instead of the
/// deadline that fired, named by its `[artifacts]` key (whichever of the
/// client's deadlines or the whole call's fires first, the error says
/// which: CI once saw the client's read deadline win the race).
#[tokio::test]
async fn a_hung_registry_is_named_by_the_deadline_that_fired() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let timeouts = ArtifactTimeouts {
        first_byte: Duration::from_millis(300),
        transfer: Duration::from_secs(30),
        ..ArtifactTimeouts::default()
    };
    let s = ArtifactStore {
        backend: Box::new(oci::Oci::new(
            &address.to_string(),
            "team/orders",
            true,
            timeouts,
        )),
        timeouts,
    };
    for result in [
        s.publish(b"v3".to_vec()).await.map(drop),
        s.fetch(&PluginDigest::of(b"v3")).await.map(drop),
    ] {
        let e = result.unwrap_err();
        assert!(
            matches!(&e, ArtifactError::TimedOut { deadline, .. } if deadline.key == "first_byte_timeout"),
            "{e}"
        );
        assert!(e.to_string().contains("no answer within 300ms"), "{e}");
    }
    held.abort();
}
