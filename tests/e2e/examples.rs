//! Every config in `examples/` passes `shardlane validate`, run from the
//! repository root as its comments say.

use shardlane_testkit::{Language, build_examples, repo_root};

use crate::common::shardlane_bin;

#[test]
fn every_example_config_validates() {
    build_examples(Language::Rust).unwrap();
    let root = repo_root();
    let mut configs: Vec<_> = std::fs::read_dir(root.join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    configs.sort();
    assert!(configs.len() >= 4, "{configs:?}");
    for config in configs {
        let out = std::process::Command::new(shardlane_bin())
            .current_dir(&root)
            .args(["validate", "--config"])
            .arg(&config)
            .env_remove("SHARDLANE_ADMIN_TOKEN")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {}",
            config.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(": ok"), "{}: {stdout}", config.display());
    }
}
