//! `shardlane deregister-consumer`: removes a fan-out subscription's
//! stream consumer from Kinesis (it costs money while registered).

use anyhow::Context as _;

use crate::config::{Config, ReadMode};
use crate::kinesis::Kinesis;

/// Deregisters the enhanced fan-out consumer of `subscription`
/// (`shardlane deregister-consumer`): returns the stream, the consumer's
/// name and whether it existed.
///
/// # Errors
/// When the subscription is not in `config`, does not read by fan-out, or
/// Kinesis refuses.
pub(crate) async fn deregister_consumer(
    config: &Config,
    subscription: &str,
) -> anyhow::Result<(String, String, bool)> {
    let sub = config
        .subscriptions
        .iter()
        .find(|s| s.name.as_str() == subscription)
        .with_context(|| format!("no subscription named {subscription:?} in the config"))?;
    let ReadMode::FanOut { consumer } = &sub.read else {
        anyhow::bail!(
            "subscription {subscription:?} reads by polling (read = \"fan_out\" is not set): it has no stream consumer"
        );
    };
    let kinesis = Kinesis::connect(&config.aws).await;
    let existed = kinesis
        .deregister_consumer(&sub.stream, consumer)
        .await
        .with_context(|| format!("cannot deregister stream consumer {consumer:?}"))?;
    Ok((sub.stream.to_string(), consumer.clone(), existed))
}

/// `shardlane deregister-consumer`.
#[derive(clap::Args)]
pub(crate) struct DeregisterArgs {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: std::path::PathBuf,
    /// The subscription's name.
    #[arg(long, short)]
    subscription: String,
}

impl DeregisterArgs {
    pub(crate) fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let config = super::bootstrap::config(&self.config)?;
        let (stream, consumer, existed) =
            super::bootstrap::one_shot(deregister_consumer(&config, &self.subscription))?;
        if existed {
            println!("deregistered stream consumer {consumer:?} of stream {stream:?}");
        } else {
            println!("stream {stream:?} has no consumer {consumer:?}: nothing to deregister");
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}
