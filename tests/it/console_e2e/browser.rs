//! Headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

pub const WAIT: Duration = Duration::from_secs(30);

fn program(env: &str, default: &str) -> PathBuf {
    let path = PathBuf::from(std::env::var(env).unwrap_or_else(|_| default.into()));
    assert!(
        path.exists(),
        "{} is absent: install Debian's chromium and chromium-driver packages (scripts/test does), \
         or point {env} at it",
        path.display()
    );
    path
}

/// A chromedriver process and one headless Chromium session on a fresh profile.
pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    pub async fn start() -> Browser {
        let chromium = program("IDEM_CHROMIUM", "/usr/bin/chromium");
        let chromedriver = program("IDEM_CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let profile =
            std::env::temp_dir().join(format!("idem-chromium-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&profile).unwrap();
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--no-first-run", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        });
        let caps = caps.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + WAIT;
        // chromedriver listens a moment after it starts: connect until it answers.
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no WebDriver session from {}: {e}", chromedriver.display()),
            }
        };
        Browser {
            client,
            driver,
            profile,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// Waits for the element with this CSS selector to exist and be shown.
    pub async fn shown(&self, css: &str) -> fantoccini::elements::Element {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && el.is_displayed().await.unwrap_or(false)
            {
                return el;
            }
            self.check(deadline, &format!("{css} is shown")).await;
        }
    }

    /// Waits until the text of `css` satisfies `ok`, and returns it.
    pub async fn text_until(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = el.text().await
                && ok(&text)
            {
                return text;
            }
            self.check(deadline, &format!("the text of {css}")).await;
        }
    }

    /// How many elements match `css` now.
    pub async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.unwrap().len()
    }

    /// The attribute `name` of each element matching `css` now, in document order (those
    /// without it are skipped).
    pub async fn attrs(&self, css: &str, name: &str) -> Vec<String> {
        let mut values = Vec::new();
        for el in self.client.find_all(Locator::Css(css)).await.unwrap() {
            values.extend(el.attr(name).await.unwrap());
        }
        values
    }

    /// Clicks the element, found again if the page re-rendered it between the find and
    /// the click (a refresh replaces the list's elements: the old one is stale).
    pub async fn click(&self, css: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match self.shown(css).await.click().await {
                Ok(()) => return,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
                Err(e) => panic!("cannot click {css}: {e}"),
            }
            self.check(deadline, &format!("{css} can be clicked")).await;
        }
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let el = self.shown(css).await;
        el.clear().await.unwrap();
        el.send_keys(text).await.unwrap();
    }

    pub async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    pub async fn screenshot(&self, path: &str) {
        let png = self.client.screenshot().await.unwrap();
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::write(&path, png).unwrap();
        println!("wrote {}", path.display());
    }

    /// Polls again after a moment, or panics with the page's text once the deadline passed.
    async fn check(&self, deadline: tokio::time::Instant, what: &str) {
        if tokio::time::Instant::now() >= deadline {
            let body = self.js("return document.body.innerText").await;
            panic!(
                "waited {WAIT:?} for {what}; the page shows:\n{}",
                body.as_str().unwrap_or("")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    pub async fn close(mut self) {
        self.client.clone().close().await.unwrap();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}
