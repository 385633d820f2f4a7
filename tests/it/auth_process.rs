//! Tokens and exposure with real processes: `idem serve` refuses to listen beyond loopback
//! without tokens unless `--insecure`; `idem token` issues, lists and revokes tokens on
//! the database (SQLite, PostgreSQL, MariaDB) and `idem tx --token` acts with them against
//! a running `idem serve --auth tokens`.

use crate::common;

use std::time::Duration;

use common::{Child, idem_run};
use idem_participant::testing;
use serde_json::Value;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn temp_sqlite(name: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("idem-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("idem.db");
    let _ = std::fs::remove_file(&file);
    let url = format!("sqlite://{}?mode=rwc", file.display());
    (dir, url)
}

#[tokio::test]
async fn beyond_loopback_needs_tokens_or_insecure() {
    let (dir, url) = temp_sqlite("exposure");
    let out = idem_run(
        &["serve", "--database-url", &url, "--listen", "0.0.0.0:0"],
        &[],
    );
    assert!(!out.status.success(), "it started: {}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("without API tokens") && said.contains("--insecure"),
        "{said}"
    );
    // Nothing was opened: the refusal comes before the database.
    assert!(!dir.join("idem.db").exists(), "the database was created");

    for extra in [&["--insecure"][..], &["--auth", "tokens"][..]] {
        let mut args = vec!["--listen", "0.0.0.0:0"];
        args.extend_from_slice(extra);
        let idem = Child::serve(&url, "", &args).await;
        let port = idem.url.rsplit(':').next().unwrap().to_owned();
        idem::transport::install_crypto_provider();
        let live = reqwest::get(format!("http://127.0.0.1:{port}/health/live"))
            .await
            .unwrap();
        assert_eq!(live.status().as_u16(), 200, "{extra:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn token_cli(args: &[&str], url: &str) -> std::process::Output {
    let mut all = vec!["token"];
    all.extend_from_slice(args);
    all.extend(["--database-url", url]);
    idem_run(&all, &[])
}

#[tokio::test]
async fn tokens_issued_listed_and_revoked_by_the_cli() {
    for db in testing::all("auth_token_cli").await {
        let name = db.name().to_owned();
        // The database exists (a migrated store made it); `idem token` never creates one.
        let store = common::open(&db.url).await;
        let out = token_cli(
            &[
                "issue", "--tenant", "acme", "--role", "operator", "--label", "ops",
            ],
            &db.url,
        );
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(token.starts_with("idem_"), "{name}: {token}");
        let id = token.split('_').nth(1).unwrap().to_owned();
        let secret = token.rsplit('_').next().unwrap().to_owned();

        // Listed by id, never with its secret or its hash.
        let out = token_cli(&["list", "--json"], &db.url);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let listed = String::from_utf8(out.stdout).unwrap();
        let row: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
        assert_eq!(
            (
                row["id"].as_str(),
                row["tenant"].as_str(),
                row["role"].as_str()
            ),
            (Some(id.as_str()), Some("acme"), Some("operator"))
        );
        assert!(!listed.contains(&secret), "{name}: the secret was listed");
        let stored = store.tokens().await.unwrap();
        assert_ne!(
            stored[0].secret_hash, secret,
            "{name}: stored in plain text"
        );

        let bad = token_cli(
            &["issue", "--tenant", "Not/OK", "--role", "client"],
            &db.url,
        );
        assert!(!bad.status.success(), "{name}: a bad tenant was accepted");

        let idem = Child::serve(
            &db.url,
            "",
            &["--auth", "tokens", "--token-refresh-ms", "100"],
        )
        .await;
        let tx_list = |token: Option<&str>| {
            let mut args = vec!["tx", "list", "--server", &idem.url];
            if let Some(token) = token {
                args.extend(["--token", token]);
            }
            idem_run(&args, &[])
        };
        let ok = tx_list(Some(&token));
        assert!(ok.status.success(), "{name}: {}", stderr(&ok));
        let refused = tx_list(None);
        assert!(!refused.status.success(), "{name}: listed without a token");
        assert!(
            stderr(&refused).contains("token_missing"),
            "{name}: {}",
            stderr(&refused)
        );
        // IDEM_TOKEN works as the flag does.
        let by_env = idem_run(
            &["tx", "list", "--server", &idem.url],
            &[("IDEM_TOKEN", &token)],
        );
        assert!(by_env.status.success(), "{name}: {}", stderr(&by_env));

        // The operator's direct view reaches every tenant's rows by `tenant/gid`.
        idem::transport::install_crypto_provider();
        let created = reqwest::Client::new()
            .post(format!("{}/api/v1/transactions", idem.url))
            .bearer_auth(&token)
            .json(&serde_json::json!({"gid": "p-1", "kind": "tcc"}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status().as_u16(), 201, "{name}");
        let listed = idem_run(&["tx", "list", "--database-url", &db.url], &[]);
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains("acme/p-1"),
            "{name}: {}",
            stderr(&listed)
        );
        let shown = idem_run(
            &[
                "tx",
                "show",
                "acme/p-1",
                "--database-url",
                &db.url,
                "--json",
            ],
            &[],
        );
        assert!(shown.status.success(), "{name}: {}", stderr(&shown));
        let view: Value = serde_json::from_slice(&shown.stdout).unwrap();
        assert_eq!(
            (view["gid"].as_str(), view["tenant"].as_str()),
            (Some("p-1"), Some("acme")),
            "{name}"
        );

        let out = token_cli(&["revoke", &id], &db.url);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let again = token_cli(&["revoke", &id], &db.url);
        assert!(!again.status.success(), "{name}: revoked twice");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let out = tx_list(Some(&token));
            if !out.status.success() {
                assert!(
                    stderr(&out).contains("token_revoked"),
                    "{name}: {}",
                    stderr(&out)
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: the revoked token still works"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(idem);
        drop(store);
        db.drop_database().await;
    }
}
