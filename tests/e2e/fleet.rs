//! A fleet on one DynamoDB lease table, as a Kubernetes rollout starts
//! it: instances started at once balance by count within a bound (every
//! instance counts from its first heartbeat, holding leases or not; a
//! lease handed over goes to the instance that asked; several asks per
//! sync), and hot shards spread by measured load. Bounded in time, on
//! loopback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shardlane_testkit::{Dynalite, HostProcess, Kinesis, guests, unique_name};

use crate::common::{shardlane_bin, trickle};
use crate::leases::{
    check_all_handled, dynamodb_config, env, handled, lease_table, producer, wait_counts,
};

#[tokio::test(flavor = "multi_thread")]
async fn four_instances_started_at_once_on_32_shards_hold_8_each() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("rollout");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 32).await.unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 64, 4);
    let env = env(&kinesis, &dynalite);

    // The default lease settings (10 s leases, 3 s heartbeats, 10 s
    // syncs): what a rollout runs.
    let started = Instant::now();
    let mut hosts: Vec<HostProcess> = ["a", "b", "c", "d"]
        .iter()
        .map(|name| {
            HostProcess::start_with(
                shardlane_bin(),
                &dynamodb_config(
                    &format!("host-{name}"),
                    &table,
                    &stream,
                    &guests.retry,
                    "",
                    "",
                ),
                &env,
            )
            .unwrap()
        })
        .collect();
    wait_counts(&dynalite, &table, &[8, 8, 8, 8], Duration::from_secs(90)).await;
    let converged = started.elapsed();
    eprintln!("four instances started at once on 32 shards: 8 each after {converged:?}");

    // Every instance reads: each handles records put from now on.
    let since: Vec<usize> = hosts.iter().map(|h| handled(&h.lines()).len()).collect();
    for (host, since) in hosts.iter_mut().zip(since) {
        host.wait_for(
            "records handled after convergence",
            Duration::from_secs(30),
            |lines| handled(lines).len() > since,
        )
        .await
        .unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let refs = handled_by_all_then_stopped(&mut hosts, &put).await;
    check_all_handled(&put, &refs);
}

/// Waits until the hosts between them handled every record of `put`,
/// then stops each (gracefully); the hosts, for checking.
async fn handled_by_all_then_stopped<'a>(
    hosts: &'a mut [HostProcess],
    put: &[String],
) -> Vec<&'a HostProcess> {
    let (first, rest) = hosts.split_first_mut().unwrap();
    let others: Vec<&HostProcess> = rest.iter().collect();
    first
        .wait_for("everything handled", Duration::from_secs(60), |lines| {
            let mut seen: HashSet<String> = handled(lines).into_iter().map(|(d, _, _)| d).collect();
            for h in &others {
                seen.extend(handled(&h.lines()).into_iter().map(|(d, _, _)| d));
            }
            put.iter().all(|d| seen.contains(d))
        })
        .await
        .unwrap();
    for host in hosts.iter_mut() {
        assert!(host.terminate().await.unwrap().success());
    }
    hosts.iter().collect()
}

/// The heartbeat items: owner → published load.
async fn heartbeats(dynalite: &Dynalite, table: &str) -> BTreeMap<String, String> {
    let items = dynalite
        .client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default();
    let s = |item: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>, k: &str| {
        item.get(k)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default()
    };
    items
        .iter()
        .filter(|item| s(item, "shard_id").starts_with("!live#"))
        .map(|item| (s(item, "owner"), s(item, "load")))
        .collect()
}

/// Each instance's published records a second.
fn totals(beats: &BTreeMap<String, String>) -> BTreeMap<String, f64> {
    beats
        .iter()
        .map(|(owner, load)| {
            let load: serde_json::Value = serde_json::from_str(load).unwrap_or_default();
            (owner.clone(), load["total"].as_f64().unwrap_or(0.0))
        })
        .collect()
}

/// Hot shards held per instance.
fn spread_of(
    table: &BTreeMap<String, (Option<String>, u64, Option<String>)>,
    hot: &[String],
) -> BTreeMap<String, usize> {
    let mut per: BTreeMap<String, usize> = ["host-a", "host-b", "host-c"]
        .iter()
        .map(|h| (h.to_string(), 0))
        .collect();
    for shard in hot {
        if let Some((Some(owner), _, _)) = table.get(shard) {
            *per.entry(owner.clone()).or_default() += 1;
        }
    }
    per
}

/// A key for each of `shards` (by probing: Kinesis hashes keys with MD5).
async fn keys_for(kinesis: &Kinesis, stream: &str, shards: &[String]) -> HashMap<String, String> {
    let probes: Vec<(String, Vec<u8>)> = (0..512)
        .map(|i| (format!("probe-{i}"), format!("probe-{i}").into_bytes()))
        .collect();
    let landed = kinesis.put_records(stream, &probes).await.unwrap();
    let mut keys = HashMap::new();
    for ((key, _), (shard, _)) in probes.iter().zip(landed) {
        if shards.contains(&shard) {
            keys.entry(shard).or_insert_with(|| key.clone());
        }
    }
    assert_eq!(keys.len(), shards.len(), "a probe key for every hot shard");
    keys
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_shards_spread_over_a_fleet_by_load_and_nothing_is_lost() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("hot");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 32).await.unwrap();
    // Four hot shards, spread over the hash key space; 28 quiet ones.
    let hot: Vec<String> = [0, 8, 16, 24]
        .iter()
        .map(|i| format!("shardId-{i:012}"))
        .collect();
    let keys = keys_for(&kinesis, &stream, &hot).await;
    let hot_keys: Vec<String> = hot.iter().map(|s| keys[s].clone()).collect();
    // About 40 records a second on each hot shard.
    let mut counters = vec![0u32; hot_keys.len()];
    let (stop, producer) = trickle(&kinesis, &stream, 8, Duration::from_millis(50), move |n| {
        let k = (n - 1) % hot_keys.len();
        counters[k] += 1;
        let data = format!("{}#{}", hot_keys[k], counters[k]);
        (hot_keys[k].clone(), data.clone().into_bytes(), data)
    });
    let env = env(&kinesis, &dynalite);
    let lease = r#"lease_duration = "6s"
renew_every = "2s"
shard_sync_every = "2s""#;
    let start = |name: &str| {
        HostProcess::start_with(
            shardlane_bin(),
            &dynamodb_config(
                &format!("host-{name}"),
                &table,
                &stream,
                &guests.retry,
                lease,
                "",
            ),
            &env,
        )
        .unwrap()
    };
    // One instance first: it takes all 32, the four hot shards with them.
    // The two that join later even the counts with the quietest leases
    // (the count rule never moves a hot one while a quiet one will do), so
    // only the load rule can spread the hot shards.
    let mut hosts = vec![start("a")];
    wait_counts(&dynalite, &table, &[32], Duration::from_secs(60)).await;
    // Its load settled (every shard measured for 15 s): from now on the
    // count rule hands over quiet shards only.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let beats = heartbeats(&dynalite, &table).await;
        let load = beats.get("host-a").cloned().unwrap_or_default();
        if load.contains("\"settled\":true") && hot.iter().all(|s| load.contains(s.as_str())) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "host-a's load never settled: {beats:?}"
        );
        // Polling the heartbeats until the published load settles.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    hosts.push(start("b"));
    hosts.push(start("c"));
    wait_counts(&dynalite, &table, &[10, 11, 11], Duration::from_secs(90)).await;
    let balanced = spread_of(&lease_table(&dynalite, &table).await, &hot);
    eprintln!(
        "counts even, hot shards per instance: {balanced:?}; records/s per instance: {:?}",
        totals(&heartbeats(&dynalite, &table).await)
    );

    // Spread: every instance holds one or two of the four hot shards (three
    // instances can do no better).
    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    loop {
        let per = spread_of(&lease_table(&dynalite, &table).await, &hot);
        if per.values().all(|n| (1..=2).contains(n)) {
            // The loads published 20 s later (smoothed over 15 s).
            tokio::time::sleep(Duration::from_secs(20)).await;
            eprintln!(
                "hot shards spread {per:?} after {:?}; records/s per instance 20 s later: {:?}",
                started.elapsed(),
                totals(&heartbeats(&dynalite, &table).await)
            );
            break;
        }
        if Instant::now() >= deadline {
            panic!(
                "hot shards never spread: {per:?}; heartbeats: {:#?}",
                heartbeats(&dynalite, &table).await
            );
        }
        // Polling the lease table while the fleet balances by load.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let refs = handled_by_all_then_stopped(&mut hosts, &put).await;
    let duplicates = check_all_handled(&put, &refs);
    eprintln!(
        "hot shards: {} records put, {duplicates} handled twice",
        put.len()
    );
    assert_eq!(duplicates, 0, "graceful hand-overs handle nothing twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_on_128_shards_reads_every_shard_and_handles_every_record() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("many");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 128).await.unwrap();
    // Records until every shard has some (Kinesis hashes keys with MD5).
    let mut put = Vec::new();
    let mut shards = HashSet::new();
    for round in 0..8 {
        let records: Vec<(String, Vec<u8>)> = (0..500)
            .map(|i| {
                let data = format!("many-{round}-{i}");
                (data.clone(), data.into_bytes())
            })
            .collect();
        for ((data, _), (shard, _)) in records
            .iter()
            .zip(kinesis.put_records(&stream, &records).await.unwrap())
        {
            put.push(data.clone());
            shards.insert(shard);
        }
        if shards.len() == 128 {
            break;
        }
    }
    assert_eq!(shards.len(), 128, "records on every shard");
    let mut host = HostProcess::start_with(
        shardlane_bin(),
        &dynamodb_config("many", &table, &stream, &guests.retry, "", ""),
        &env(&kinesis, &dynalite),
    )
    .unwrap();
    let started = Instant::now();
    host.wait_for("every record handled", Duration::from_secs(180), |lines| {
        let seen: HashSet<String> = handled(lines).into_iter().map(|(d, _, _)| d).collect();
        put.iter().all(|d| seen.contains(d))
    })
    .await
    .unwrap();
    let read: HashSet<String> = handled(&host.lines())
        .into_iter()
        .map(|(_, shard, _)| shard)
        .collect();
    assert_eq!(read.len(), 128, "every shard read");
    eprintln!(
        "128 shards: {} records handled {:?} after start",
        put.len(),
        started.elapsed()
    );
    assert!(host.terminate().await.unwrap().success());
    assert_eq!(check_all_handled(&put, &[&host]), 0, "nothing twice");
}
