//! A real browser for the dashboard's tests: Debian's headless Chromium, driven through
//! Debian's chromedriver over WebDriver (fantoccini), both on this machine.
//!
//! chromedriver listens on a loopback port picked here; Chromium runs headless with
//! `--no-sandbox` (the tests run as root, where Chromium's sandbox refuses to start), a fixed
//! window size and the `Accept-Language` asked for. Both run in their own process group, killed
//! on drop, so a failed test leaves no browser behind.
//!
//! The tests that need them are marked `#[ignore = "needs chromium and chromedriver"]`: a
//! plain run lists them as skipped, `cargo xtask test` runs them (`--run-ignored`, after
//! `tests/setup-deps.sh` installed both), and there a missing browser fails them.
#![allow(clippy::disallowed_methods)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| std::env::split_paths(&path).map(|d| d.join(n)).find(|p| p.is_file()))
}

/// The browser and its driver; panics when either is missing.
fn chromium(test: &str) -> (PathBuf, PathBuf) {
    match (which(&["chromium", "chromium-browser"]), which(&["chromedriver"])) {
        (Some(c), Some(d)) => (c, d),
        _ => panic!("{test}: chromium or chromedriver is missing (apt-get install chromium chromium-driver)"),
    }
}

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium whose `Accept-Language` is `accept_language`
    /// (e.g. `"ru-RU,ru"`); panics when they are missing.
    pub async fn start(test: &str, accept_language: &str) -> Browser {
        Browser::start_with(test, accept_language, &[]).await
    }

    /// [`Browser::start`] with more Chromium arguments (e.g. `--host-resolver-rules=MAP
    /// name 127.0.0.1`, to reach a name on loopback).
    pub async fn start_with(test: &str, accept_language: &str, more_args: &[String]) -> Browser {
        Browser::launch(test, accept_language, more_args, "UTC").await
    }

    /// [`Browser::start`] with the browser's time zone `zone` (an IANA name, e.g.
    /// `"Asia/Tokyo"`), as the owner's computer would have it; the others run in UTC, whatever
    /// this machine's zone (issue 46: the cabinet shows times in the browser's zone).
    pub async fn start_in_zone(test: &str, accept_language: &str, zone: &str) -> Browser {
        Browser::launch(test, accept_language, &[], zone).await
    }

    async fn launch(test: &str, accept_language: &str, more_args: &[String], zone: &str) -> Browser {
        let (chromium, chromedriver) = chromium(test);
        let profile = tempfile::Builder::new().prefix("gpum-chromium").tempdir().expect("profile dir");
        let port = free_port();
        let log = std::fs::File::create(profile.path().join("chromedriver.log")).expect("log");
        let mut cmd = Command::new(chromedriver);
        cmd.arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            // Chromium, started by chromedriver, inherits it, and takes its zone from it.
            .env("TZ", zone)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut driver = cmd.spawn().expect("spawn chromedriver");
        let end = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > end || matches!(driver.try_wait(), Ok(Some(_))) {
                let _ = driver.kill();
                panic!(
                    "chromedriver did not listen on 127.0.0.1:{port}: {}",
                    std::fs::read_to_string(profile.path().join("chromedriver.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = vec![
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--no-first-run".to_owned(),
            "--window-size=960,720".to_owned(),
            "--hide-scrollbars".to_owned(),
            format!("--user-data-dir={}", profile.path().join("profile").display()),
            format!("--accept-lang={accept_language}"),
        ];
        args.extend(more_args.iter().cloned());
        let caps = serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": args,
                "prefs": { "intl.accept_languages": accept_language },
            }
        });
        let serde_json::Value::Object(caps) = caps else { unreachable!() };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("start a Chromium session through chromedriver: {e}"));
        Browser { client, driver, _profile: profile }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    pub async fn url(&self) -> String {
        self.client.current_url().await.expect("current url").to_string()
    }

    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("find {css}: {e}"))
    }

    pub async fn has(&self, css: &str) -> bool {
        !self.client.find_all(Locator::Css(css)).await.expect("find_all").is_empty()
    }

    /// Waits (up to 10 s) until `css` matches, e.g. after a click that submits a form.
    pub async fn wait_for(&self, css: &str) {
        let end = Instant::now() + Duration::from_secs(10);
        while !self.has(css).await {
            assert!(
                Instant::now() < end,
                "no {css} after 10 s; page:\n{}",
                self.client.source().await.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the element `css` matches. A live region is replaced every 2 s, so an element
    /// found may be gone when read (a stale element): it is found again, a few times at most.
    pub async fn text(&self, css: &str) -> String {
        let mut stale = 0;
        loop {
            match self.find(css).await.text().await {
                Ok(t) => return t,
                Err(e) if e.is_stale_element_reference() && stale < 5 => stale += 1,
                Err(e) => panic!("text of {css}: {e}"),
            }
        }
    }

    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// The page's text, as the user sees it.
    pub async fn body_text(&self) -> String {
        self.text("body").await
    }

    /// Runs `script` in the page and returns its value.
    pub async fn js(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("execute {script}: {e}"))
    }

    /// Polls the page (no reload) until `css` matches an element whose attribute `attr` is one
    /// of `values`; returns the value. Panics with the page's text after `timeout`.
    pub async fn wait_attr(&self, css: &str, attr: &str, values: &[&str], timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            // The live region is replaced every 2 s: an element found may be gone when read.
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && let Ok(Some(v)) = el.attr(attr).await
                && values.contains(&v.as_str())
            {
                return v;
            }
            if Instant::now() > end {
                panic!("timed out after {timeout:?} waiting for {css}[{attr}] in {values:?}; page:\n{}", {
                    self.client.source().await.unwrap_or_default()
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A PNG of the page as it is now.
    pub async fn screenshot(&self) -> Vec<u8> {
        self.client.screenshot().await.expect("screenshot")
    }

    /// Ends the WebDriver session; dropping the browser then stops chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

fn kill_group(c: &mut Child) {
    let pgid = nix::unistd::Pid::from_raw(c.id() as i32);
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = c.wait();
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.driver);
    }
}
