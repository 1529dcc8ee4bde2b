//! `lockctl serve` in a real browser: headless Chromium, driven through chromedriver
//! (WebDriver), reads the page of a five-instance scheduled run on Redis, PostgreSQL and etcd
//! and finds each firing with the instance that ran it, in the table and on the timeline, as
//! `lockctl history` lists them; the page is read-only unless asked, a forced release needs
//! its key typed, and the store's password appears nowhere. A screenshot of the job's page is
//! left in the test's output directory.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use fantoccini::{Client, ClientBuilder, Locator};
use lock_runtime::{Run, RunOutcome, Scheduler};
use lock_tests::{EtcdCluster, PostgresServer, RedisServer};

const PASSWORD: &str = "s3cret-page-pw";

/// A binary from Debian's packages, or the variable naming it; a clear failure when missing.
fn binary(var: &str, name: &str, package: &str) -> PathBuf {
    if let Ok(path) = std::env::var(var) {
        return PathBuf::from(path);
    }
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/lib/chromium"] {
        let path = PathBuf::from(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!("`{name}` not found: apt-get install {package} (or set {var})");
}

/// A process this test started, killed (by its PID) when dropped.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `lockctl serve` on the store `store` names (lockctl's options), on a free loopback port,
/// with `extra` options; the process and its URL.
fn serve(store: &[String], extra: &[&str]) -> (Started, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(store)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("REDIS_URL")
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting lockctl serve");
    let stdout = child.stdout.take().expect("piped stdout");
    let started = Started(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reading lockctl's first line");
    let at = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in `{line}`"))
        .trim_end_matches('/')
        .to_owned();
    (started, at)
}

/// chromedriver on a free loopback port, once it takes connections.
fn chromedriver() -> (Started, u16) {
    let driver = binary("CHROMEDRIVER_BIN", "chromedriver", "chromium-driver");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromedriver");
    let started = Started(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver took no connection within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (started, port)
}

async fn browser(port: u16, profile: &std::path::Path) -> Client {
    let chromium = binary("CHROMIUM_BIN", "chromium", "chromium");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "binary": chromium,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1280,1100",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session through chromedriver")
}

/// Types `key` into the release page's confirmation and submits it; what the page then says.
async fn confirm_release(c: &Client, key: &str) -> String {
    let field = c
        .wait()
        .for_element(Locator::Id("confirm"))
        .await
        .expect("the confirmation field");
    field.clear().await.expect("clearing it");
    field.send_keys(key).await.expect("typing");
    c.find(Locator::Id("release"))
        .await
        .expect("the button")
        .click()
        .await
        .expect("submitting");
    // A click may return before the page it leads to has loaded: wait for it (fantoccini's
    // wait looks every 250 ms, for up to 30 s); a loaded machine takes a while to navigate.
    c.wait()
        .for_element(Locator::Id("outcome"))
        .await
        .expect("the outcome")
        .text()
        .await
        .expect("its text")
}

#[lock_runtime::scheduled(every = "1s", name = "web-posting")]
#[lock_runtime::distributed_lock(key = "web-posting", ttl = "10s")]
async fn web_posting() -> Result<(), lock_runtime::LockError> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Five instances, their clocks 0, +0.4, -0.7, +1.2 and -1.9 s apart, run a job of every
/// second (50 ms a run) for 7 s on the store `url` names ([`lock_tests::builder_for`]); the
/// job's journal, each firing once.
async fn five_instances_run_the_job(url: &str) -> Vec<Run> {
    let mut schedulers = Vec::new();
    for (i, skew_ms) in [0i64, 400, -700, 1_200, -1_900].into_iter().enumerate() {
        let runtime = lock_tests::builder_for(url)
            .owner(format!("instance-{}", i + 1))
            .build()
            .await
            .expect("a runtime");
        let skew = Duration::from_millis(skew_ms.unsigned_abs());
        let start = if skew_ms >= 0 {
            SystemTime::now() + skew
        } else {
            SystemTime::now() - skew
        };
        schedulers.push(tokio::spawn(
            Scheduler::new(runtime)
                .only(["web-posting"])
                .wall_clock_from(start)
                .run_until(tokio::time::sleep(Duration::from_secs(7))),
        ));
    }
    for s in schedulers {
        s.await
            .expect("a scheduler task")
            .expect("the scheduler ran");
    }
    let reader = lock_tests::builder_for(url)
        .owner("test-reader")
        .build()
        .await
        .expect("a runtime");
    let runs = reader.history("web-posting", 100).await.expect("history");
    let ran: Vec<_> = runs
        .iter()
        .filter(|r| *r.outcome() == RunOutcome::Ok)
        .collect();
    assert!(ran.len() >= 4, "{} runs in 7 s: {runs:?}", ran.len());
    let mut firings: Vec<String> = runs.iter().map(|r| rfc3339(r.scheduled_at())).collect();
    firings.sort();
    firings.dedup();
    assert_eq!(
        firings.len(),
        runs.len(),
        "a firing journalled twice: {runs:?}"
    );

    runs
}

/// `lockctl history` says what the journal says: each run, its instance and outcome.
async fn lockctl_history_agrees(store: &[String], runs: &[Run]) {
    let store = store.to_vec();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(&store)
            .args(["--json", "history", "web-posting", "--limit", "100"])
            .env_remove("REDIS_URL")
            .output()
            .expect("running lockctl")
    })
    .await
    .expect("join");
    assert!(out.status.success(), "lockctl history: {out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("lockctl's JSON");
    let listed: Vec<(String, String, String)> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            let text = |f: &str| r[f].as_str().unwrap_or_default().to_owned();
            (text("scheduled_at"), text("owner"), text("outcome"))
        })
        .collect();
    let journalled: Vec<(String, String, String)> = runs
        .iter()
        .map(|r| {
            (
                rfc3339(r.scheduled_at()),
                r.owner().to_owned(),
                r.outcome().label().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed, journalled, "lockctl history against the journal");
}

/// In Chromium: the job's row in the jobs table, then its page, where each journalled run is
/// a row naming its firing, instance and outcome and a mark in its instance's lane of the
/// timeline. The browser is left on the job's page.
async fn the_job_page_agrees(c: &Client, page_url: &str, runs: &[Run]) {
    // The jobs table, and from it the job's page.
    c.goto(&format!("{page_url}/"))
        .await
        .expect("the home page");
    let row = c
        .find(Locator::Css("#jobs tr[data-job='web-posting']"))
        .await
        .expect("the job's row in the jobs table");
    let cells = row.find_all(Locator::Css("td")).await.expect("cells");
    assert_eq!(
        cells[1].text().await.expect("text"),
        "every 1s",
        "the schedule"
    );
    assert_eq!(
        cells[4].text().await.expect("text"),
        runs[0].owner(),
        "the last run's instance"
    );
    assert_eq!(
        cells[7].text().await.expect("text"),
        "-",
        "nobody holds the job's lock"
    );
    row.find(Locator::Css("a"))
        .await
        .expect("the job's link")
        .click()
        .await
        .expect("following it");
    let heading = c
        .wait()
        .for_element(Locator::Id("job"))
        .await
        .expect("the job's heading");
    assert_eq!(heading.text().await.expect("text"), "web-posting");
    assert!(
        c.current_url()
            .await
            .expect("url")
            .as_str()
            .ends_with("/jobs/web-posting")
    );

    // Each firing once, with the instance that journalled it and its outcome.
    let rows = c
        .find_all(Locator::Css("#runs tbody tr"))
        .await
        .expect("the runs table");
    assert_eq!(rows.len(), runs.len(), "one row per journalled run");
    for (row, run) in rows.iter().zip(runs) {
        let cells = row.find_all(Locator::Css("td")).await.expect("cells");
        let at = rfc3339(run.scheduled_at());
        assert_eq!(cells[0].text().await.expect("text"), at);
        assert_eq!(
            cells[1].text().await.expect("text"),
            run.owner(),
            "firing {at}"
        );
        assert_eq!(
            cells[2].attr("class").await.expect("class").as_deref(),
            Some(run.outcome().label()),
            "firing {at}"
        );
    }
    // The timeline: one mark per run, in the lane of its instance, as drawn by Chromium.
    let marks = c
        .find_all(Locator::Css("#timeline .mark"))
        .await
        .expect("the timeline's marks");
    assert_eq!(marks.len(), runs.len(), "one mark per run");
    for mark in &marks {
        let at = mark
            .attr("data-firing")
            .await
            .expect("attr")
            .unwrap_or_default();
        let who = mark
            .attr("data-instance")
            .await
            .expect("attr")
            .unwrap_or_default();
        let run = runs
            .iter()
            .find(|r| rfc3339(r.scheduled_at()) == at)
            .unwrap_or_else(|| panic!("a mark for a firing not journalled: {at}"));
        assert_eq!(who, run.owner(), "firing {at}");
        let (_, _, width, height) = mark.rectangle().await.expect("drawn");
        assert!(
            width >= 1.0 && height >= 1.0,
            "firing {at} is not drawn: {width}x{height}"
        );
    }
}

/// The five instances on a password-protected Redis server; then `lockctl history`, the page
/// in Chromium (and its screenshot), no password on it, and forced release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_who_ran_each_firing_in_a_real_browser() {
    let server = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", server.port());
    let store = vec!["--redis".to_owned(), url.clone()];
    let runs = five_instances_run_the_job(&url).await;
    lockctl_history_agrees(&store, &runs).await;
    let reader = lock_tests::builder_for(&url)
        .owner("test-reader")
        .build()
        .await
        .expect("a runtime");

    let (_page, page_url) = serve(&store, &[]);
    let (_driver, driver_port) = chromedriver();
    let profile = tempfile::tempdir().expect("a profile directory");
    let c = browser(driver_port, profile.path()).await;
    the_job_page_agrees(&c, &page_url, &runs).await;
    let source = c.source().await.expect("the page's source");
    assert!(!source.contains(PASSWORD), "the password is on the page");
    assert!(
        source.contains(":***@127.0.0.1"),
        "the store is named: {source}"
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lockctl-serve");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    let shot = dir.join("job-page.png");
    let png = c.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    std::fs::write(&shot, png).expect("writing the screenshot");
    println!("screenshot of the job's page: {}", shot.display());

    // Read-only: no release link, and the release page refuses.
    let holder = lock_tests::builder_for(&url)
        .owner("web-holder")
        .build()
        .await
        .expect("a runtime");
    let guard = holder
        .lock("held-for-the-page")
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await
        .expect("the store answers")
        .expect("free");
    c.goto(&format!("{page_url}/"))
        .await
        .expect("the home page");
    let row = c
        .find(Locator::Css("#locks tr[data-key='held-for-the-page']"))
        .await
        .expect("the held lock's row");
    assert!(
        row.find(Locator::Css("a")).await.is_err(),
        "a release link on a read-only page"
    );
    c.goto(&format!("{page_url}/locks/held-for-the-page/release"))
        .await
        .expect("the release page");
    c.find(Locator::Id("read-only"))
        .await
        .expect("the release page refuses");

    // With --allow-force-release: a release needs the key typed.
    let (_releasing, releasing_url) = serve(&store, &["--allow-force-release"]);
    c.goto(&format!("{releasing_url}/"))
        .await
        .expect("the home page");
    c.find(Locator::Css("#locks tr[data-key='held-for-the-page'] a"))
        .await
        .expect("the release link")
        .click()
        .await
        .expect("following it");
    let said = confirm_release(&c, "held-for-the-pag").await;
    assert!(said.contains("did not name the key"), "a wrong key: {said}");
    assert!(
        !guard.lease().is_lost()
            && reader
                .inspect("held-for-the-page")
                .await
                .expect("inspect")
                .is_some()
    );
    c.back().await.expect("back to the confirmation");
    let said = confirm_release(&c, "held-for-the-page").await;
    assert!(said.starts_with("Released held-for-the-page"), "{said}");
    assert!(
        reader
            .inspect("held-for-the-page")
            .await
            .expect("inspect")
            .is_none()
    );
    // The lock taken again by the same owner; the confirmation drawn for the first holding,
    // submitted again, leaves the new holding alone.
    let again = holder
        .lock("held-for-the-page")
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await
        .expect("the store answers")
        .expect("free after the forced release");
    c.back().await.expect("back to the confirmation");
    let said = confirm_release(&c, "held-for-the-page").await;
    assert!(said.contains("was not released"), "{said}");
    assert!(!again.lease().is_lost());
    let before = reader
        .inspect("held-for-the-page")
        .await
        .expect("inspect")
        .expect("the new holding stays");
    let again_fence = again.lease().fence().await.expect("a fence");
    let now = reader
        .inspect("held-for-the-page")
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(now.fence, Some(again_fence));
    assert_eq!(
        now.holder, before.holder,
        "one holding, before and after its fence"
    );
    c.close().await.expect("closing the browser");
    drop(guard);
    assert!(again.release().await.expect("release"));
}

/// The same run, `lockctl history` and page on PostgreSQL and on etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_who_ran_each_firing_on_postgres_and_etcd() {
    let postgres = PostgresServer::start();
    let etcd = EtcdCluster::start(1);
    let endpoints = etcd.endpoints().join(",");
    let stores = [
        (
            postgres.url(),
            vec!["--postgres".to_owned(), postgres.url()],
        ),
        (
            format!("etcd:{endpoints}"),
            vec!["--etcd".to_owned(), endpoints.clone()],
        ),
    ];
    let (_driver, driver_port) = chromedriver();
    let profile = tempfile::tempdir().expect("a profile directory");
    let c = browser(driver_port, profile.path()).await;
    for (url, store) in stores {
        let runs = five_instances_run_the_job(&url).await;
        lockctl_history_agrees(&store, &runs).await;
        let (_page, page_url) = serve(&store, &[]);
        the_job_page_agrees(&c, &page_url, &runs).await;
    }
    c.close().await.expect("closing the browser");
}
