//! `[aws] profile` and `[aws] role_arn` through the SDK's own providers:
//! recording endpoints (tests/kit `recorder`) stand where Kinesis and STS
//! would be and keep what the host's SDK sends, so a test sees which
//! credentials signed a call and which role was asked for. (No emulator
//! here checks signatures or speaks STS.)

use std::process::{Command, Output};

use shardlane_testkit::guests;
use shardlane_testkit::recorder::Recorder;

use crate::common::shardlane_bin;

/// What Kinesis answers for a stream that does not exist: start-up stops
/// at once, after the first signed call.
fn kinesis_not_found() -> Recorder {
    Recorder::start(
        400,
        "application/x-amz-json-1.1",
        r#"{"__type":"ResourceNotFoundException","message":"Stream s not found"}"#,
    )
    .unwrap()
}

/// `shardlane run` with `aws` as the `[aws]` section, `env` added and the
/// usual AWS variables removed (so only the config's chain applies).
fn run(aws: &str, env: &[(&str, String)]) -> Output {
    let guests = guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(
        &path,
        format!(
            "[aws]\n{aws}\n[lease]\nstore = \"memory\"\n[[subscription]]\nname = \"a\"\nstream = \"s\"\nplugin = \"{}\"\n",
            guests.echo.display()
        ),
    )
    .unwrap();
    let mut command = Command::new(shardlane_bin());
    command.args(["run", "--config"]).arg(&path);
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL_KINESIS",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().map(|(k, v)| (*k, v)));
    command.output().unwrap()
}

fn authorization(request: &str) -> &str {
    request
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .unwrap_or_default()
}

#[test]
fn a_named_profile_gives_the_credentials_and_the_region() {
    let kinesis = kinesis_not_found();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    let credentials = dir.path().join("credentials");
    std::fs::write(&config, "[profile shardlane-test]\nregion = eu-west-3\n").unwrap();
    std::fs::write(
        &credentials,
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = x\n[shardlane-test]\naws_access_key_id = AKIDPROFILETEST\naws_secret_access_key = secret\n",
    )
    .unwrap();
    let out = run(
        "profile = \"shardlane-test\"",
        &[
            ("AWS_CONFIG_FILE", config.display().to_string()),
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                credentials.display().to_string(),
            ),
            ("AWS_ENDPOINT_URL_KINESIS", kinesis.url()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("does not exist"), "{stderr}");
    let requests = kinesis.requests();
    assert!(!requests.is_empty(), "the host called Kinesis");
    let auth = authorization(&requests[0]);
    assert!(auth.contains("Credential=AKIDPROFILETEST/"), "{auth}");
    assert!(auth.contains("/eu-west-3/kinesis/aws4_request"), "{auth}");
}

#[test]
fn a_role_is_assumed_with_its_external_id_and_its_credentials_sign_the_calls() {
    let kinesis = kinesis_not_found();
    let sts = Recorder::start(
        200,
        "text/xml",
        r#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <Credentials>
      <AccessKeyId>AKIDROLETEST</AccessKeyId>
      <SecretAccessKey>secret</SecretAccessKey>
      <SessionToken>token</SessionToken>
      <Expiration>2099-01-01T00:00:00Z</Expiration>
    </Credentials>
    <AssumedRoleUser>
      <AssumedRoleId>AROATEST:shardlane</AssumedRoleId>
      <Arn>arn:aws:sts::123456789012:assumed-role/stream-reader/shardlane</Arn>
    </AssumedRoleUser>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#,
    )
    .unwrap();
    let out = run(
        "region = \"us-east-1\"\nrole_arn = \"arn:aws:iam::123456789012:role/stream-reader\"\nexternal_id = \"ext-42\"",
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDBASE".into()),
            ("AWS_SECRET_ACCESS_KEY", "base-secret".into()),
            ("AWS_ENDPOINT_URL_KINESIS", kinesis.url()),
            ("AWS_ENDPOINT_URL_STS", sts.url()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("does not exist"), "{stderr}");
    let asked = sts.requests();
    assert_eq!(asked.len(), 1, "one AssumeRole: {asked:?}");
    assert!(asked[0].contains("Action=AssumeRole"), "{}", asked[0]);
    assert!(
        asked[0].contains("RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fstream-reader"),
        "{}",
        asked[0]
    );
    assert!(asked[0].contains("ExternalId=ext-42"), "{}", asked[0]);
    assert!(
        asked[0].contains("RoleSessionName=shardlane"),
        "{}",
        asked[0]
    );
    assert!(
        authorization(&asked[0]).contains("Credential=AKIDBASE/"),
        "the base credentials ask"
    );
    let called = kinesis.requests();
    assert!(!called.is_empty());
    assert!(
        authorization(&called[0]).contains("Credential=AKIDROLETEST/"),
        "the role's credentials sign Kinesis calls: {}",
        authorization(&called[0])
    );
}
